"""One Lockgate engine process, for tests that start real processes and SIGKILL them.

    python -m tests.support.procs.engine_process [--principal P] <command> [args]

Configured only through the environment, like a deployed instance: `DATABASE_URL`,
`LOCKGATE_NOTES_DIR`, `LOCKGATE_SECRET_NOTES_TOKEN`, `LOCKGATE_INSTANCE_NAME`,
`LOCKGATE_LEASE_TTL`, `LOCKGATE_HEARTBEAT_INTERVAL`, `LOCKGATE_CONSERVATIVE_RECOVERY`, and
`LOCKGATE_CRASH_AT` (crash point names; the process SIGKILLs itself when one is reached).

Every command prints exactly ONE JSON line on stdout (flushed), then exits 0, or holds:

- `execute <code> [--hold] [--parallel N]`: an ExecutionView. `--hold` keeps the process
  alive afterwards (heartbeating and running pending work in the background threads) until it
  is killed. `--parallel N` runs N copies of the code at once on N threads and prints a list
  of views; with a crash point armed, the kill waits until all N threads reached it (a
  barrier), so it leaves N executions in the same place at once.
- `resume <execution_id> <principal> <accept|decline|cancel>`: an ExecutionView.
- `get <execution_id> <principal>`: an ExecutionView.
- `recover`: boot (one maintenance round: heartbeat, recovery, expiry sweep; then the pending
  work), and print the boot RecoveryReport.
- `serve`: start the background threads, print `{"serving": <instance id>}`, hold.

A LockgateError prints `{"error": {...}}`. A process that holds never stops by itself.

`ENGINE_PROCESS_GATE=<directory>` (a test's, not a Lockgate setting) makes the process get
ready (imports, database, sandbox, its instance row), create `ready-<pid>` there, and wait
for a file named `go` before it boots, so that several processes can start work together.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.faults import CrashMode, Faults
from lockgate.machine.runtime import Runtime
from lockgate.machine.settings import Settings
from lockgate.spec.crash_points import CrashPoint


class BarrierFaults(Faults):
    """Armed points fire only once `parties` threads have reached one (then the first to
    arrive kills the process): N concurrent executions die at the same place."""

    def __init__(self, armed: Iterable[CrashPoint], parties: int) -> None:
        super().__init__(armed, mode=CrashMode.KILL)
        self.barrier = threading.Barrier(parties, timeout=60)

    def reached(self, point: CrashPoint) -> None:
        if point in self.armed:
            # A thread that never gets here breaks the barrier: crash anyway, the test sees
            # what is left.
            with contextlib.suppress(threading.BrokenBarrierError):
                self.barrier.wait()
        super().reached(point)


def emit(value: Any) -> None:
    sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
    sys.stdout.flush()


def answer(action: Callable[[], Any]) -> Any:
    """The command's result as JSON: a view dumped, or the LockgateError it raised."""
    try:
        result = action()
    except LockgateError as err:
        return {"error": err.as_dict()}
    return result.model_dump(mode="json")


def hold_forever() -> None:
    forever = threading.Event()
    while True:
        forever.wait(3600)


def pass_gate(directory: str, timeout: float = 60.0) -> None:
    gate = Path(directory)
    (gate / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout
    while not (gate / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"the gate {gate} did not open in {timeout:g} s")
        time.sleep(0.002)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.support.procs.engine_process")
    parser.add_argument("--principal", default="alice")
    commands = parser.add_subparsers(dest="command", required=True)
    execute = commands.add_parser("execute")
    execute.add_argument("code")
    execute.add_argument("--hold", action="store_true")
    execute.add_argument("--parallel", type=int, default=1)
    resume = commands.add_parser("resume")
    resume.add_argument("execution_id")
    resume.add_argument("principal")
    resume.add_argument("action", choices=[a.value for a in Action])
    get = commands.add_parser("get")
    get.add_argument("execution_id")
    get.add_argument("principal")
    commands.add_parser("recover")
    commands.add_parser("serve")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    faults: Faults | None = None
    if args.command == "execute" and args.parallel > 1:
        faults = BarrierFaults(Faults.from_environment().armed, args.parallel)
    runtime = Runtime.create(Settings(), faults=faults)
    engine = runtime.engine
    if os.environ.get("ENGINE_PROCESS_GATE"):
        pass_gate(os.environ["ENGINE_PROCESS_GATE"])
    if args.command == "serve":
        runtime.start(background=True)
        emit({"serving": runtime.lease.id, "pid": os.getpid()})
        hold_forever()
    # Boot without the worker thread first: it would race `execute` for the execution it
    # has just submitted (see Engine.execute: submit and claim are two transactions).
    runtime.start(background=False)
    if args.command == "execute":
        if args.parallel > 1:
            with ThreadPoolExecutor(args.parallel) as pool:
                runs = [
                    pool.submit(answer, lambda: engine.execute(args.principal, args.code))
                    for _ in range(args.parallel)
                ]
                emit([run.result() for run in runs])
        else:
            emit(answer(lambda: engine.execute(args.principal, args.code)))
        if args.hold:
            runtime.start(background=True)  # heartbeat (and run pending work) until killed
            hold_forever()
    elif args.command == "resume":
        emit(answer(lambda: engine.resume(args.execution_id, args.principal, Action(args.action))))
    elif args.command == "get":
        emit(answer(lambda: engine.get(args.execution_id, args.principal)))
    elif args.command == "recover":
        emit(dataclasses.asdict(runtime.boot_report) if runtime.boot_report else None)
    runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
