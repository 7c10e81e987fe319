"""A Lockgate engine process driven over stdin/stdout, for the real-process simulation.

One JSON command per line in, one JSON answer per line out. Configured by the environment
like any Lockgate process (DATABASE_URL, LOCKGATE_*); `LOCKGATE_CRASH_AT` arms crash points
that SIGKILL this very process when reached.

    {"op": "execute", "principal": "alice", "code": "..."}
    {"op": "resume", "principal": "alice", "execution_id": "...", "action": "accept"}
    {"op": "get", "principal": "alice", "execution_id": "..."}
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from machine.engine import Action
from machine.errors import LockgateError
from machine.runtime import Runtime


def answer(runtime: Runtime, command: dict[str, Any]) -> dict[str, Any]:
    engine = runtime.engine
    principal = str(command.get("principal", "alice"))
    op = command.get("op")
    try:
        if op == "execute":
            view = engine.execute(principal, str(command["code"]))
        elif op == "resume":
            view = engine.resume(str(command["execution_id"]), principal, Action(command["action"]))
        elif op == "get":
            view = engine.get(str(command["execution_id"]), principal)
        else:
            return {"error": {"code": "invalid_input", "message": f"unknown op {op!r}"}}
    except LockgateError as exc:
        error = exc.as_dict()
        status = getattr(exc, "status", None)
        if status is not None:
            error["status"] = str(status)
        return {"error": error}
    return {"view": view.model_dump(mode="json")}


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    runtime = Runtime.create()
    runtime.start(background=False)
    print(json.dumps({"ready": runtime.lease.incarnation}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        print(json.dumps(answer(runtime, json.loads(line))), flush=True)
    runtime.close()


if __name__ == "__main__":
    main()
