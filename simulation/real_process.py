"""The real-process simulation: `lockgate serve` runs in its own process, is SIGKILLed at the
armed crash point (armed through `LOCKGATE_CRASH_AT`), restarted, and driven through its
real interface (MCP over HTTP with the official client); the invariants are then checked on
the database and the tools' data.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import JsonValue

from machine.db.connect import open_engine
from machine.db.migrate import upgrade
from machine.db.store import SqlStore
from machine.engine import Action
from machine.errors import LockgateError
from machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    ExecutionNotFound,
)
from machine.tools.notes import NotesSource
from server.keys import ApiKeys
from simulation.invariants import Violation, check_all, history
from simulation.scenarios import Scenario, ScenarioFailed
from simulation.sweep import RunResult
from simulation.world import CANARY
from spec import CrashPoint
from spec import ExecutionStatus as E

ROOT = Path(__file__).resolve().parent.parent
MAX_RESTARTS = 3


class ProcessKilled(Exception):
    """The server process died (SIGKILL at the armed point)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """`lockgate serve` in its own process, on a free loopback port."""

    def __init__(self, env: dict[str, str], log: IO[str]) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProcessKilled(f"the server exited with {self.proc.returncode} at boot")
            try:
                if httpx2.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.1)  # polling a starting process; the deadline bounds it
        raise RuntimeError("the server did not become ready within 60 s")

    def release(self) -> None:
        """Make sure the process is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_ERRORS: dict[str, Callable[[str, dict[str, Any]], LockgateError]] = {
    "execution_not_found": lambda eid, e: ExecutionNotFound(execution_id=eid),
    "execution_expired": lambda eid, e: ExecutionExpired(execution_id=eid, deadline=None),
    "execution_already_settled": lambda eid, e: ExecutionAlreadySettled(
        execution_id=eid, status="?", detail="answered remotely"
    ),
    "execution_interrupted": lambda eid, e: ExecutionInterrupted(
        execution_id=eid, what_ran=e.get("what_ran")
    ),
}
_STATUS = {
    "completed": E.COMPLETED,
    "waiting_for_interaction": E.WAITING_FOR_INTERACTION,
    "running": E.RUNNING,
    "error": E.FAILED,
}


@dataclass(frozen=True)
class RemoteView:
    """What a client learns of an execution from the MCP answers."""

    id: str
    status: E
    result: JsonValue = None
    error: JsonValue = None
    what_ran: JsonValue = None


class McpClient:
    """The scenario client over MCP (a new 2025 session per call, as some clients do)."""

    def __init__(self, start: Callable[[], ServerProcess], key: str) -> None:
        self.start, self.key = start, key
        self.server = start()
        self.principal = "sim"
        self.memory: dict[str, Any] = {}

    def remember(self, key: str, compute: Any) -> Any:
        if key not in self.memory:
            self.memory[key] = compute()
        return self.memory[key]

    def _call(self, tool: str, arguments: dict[str, Any]) -> RemoteView:
        async def call() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {self.key}"}
            async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
                transport = streamable_http_client(f"{self.server.url}/mcp", http_client=http)
                async with Client(transport, mode="legacy") as client:
                    result = await client.call_tool(tool, arguments)
                    return dict(result.structured_content or {})

        try:
            answer = asyncio.run(call())
        except BaseException as exc:  # the server died mid-request: a transport failure
            if self.server.proc.poll() is None:
                raise
            raise ProcessKilled(f"the server died ({self.server.proc.returncode})") from exc
        status = str(answer.get("status"))
        eid = str(answer.get("executionId", arguments.get("executionId", "")))
        if status in _ERRORS:
            error = answer.get("error")
            raise _ERRORS[status](eid, error if isinstance(error, dict) else {})
        if status not in _STATUS:
            raise ScenarioFailed(f"unexpected answer: {answer}")
        return RemoteView(
            id=eid,
            status=_STATUS[status],
            result=answer.get("result"),
            error=answer.get("error"),
        )

    def execute(self, code: str) -> RemoteView:
        return self._call("execute", {"code": code})

    def resume(self, execution_id: str, action: Action) -> RemoteView:
        return self._call("resume", {"executionId": execution_id, "action": str(action)})

    def get(self, execution_id: str) -> RemoteView:
        """The execution as it is: final outcomes that `resume` reports as errors are
        states here, as the engine's own `get` gives them."""
        try:
            return self._call("resume", {"executionId": execution_id})
        except ExecutionInterrupted as exc:
            return RemoteView(execution_id, E.INTERRUPTED, what_ran=exc.what_ran)
        except ExecutionExpired:
            return RemoteView(execution_id, E.EXPIRED)
        except ExecutionAlreadySettled:
            return RemoteView(execution_id, E.CANCELLED)


def run_in_process(
    scenario: Scenario, point: CrashPoint | None, database_url: str | None = None
) -> RunResult:
    """One scenario against a real `lockgate serve` process SIGKILLed at `point`."""
    workdir = Path(tempfile.mkdtemp(prefix="lockgate-simproc-"))
    url = database_url or f"sqlite:///{workdir / 'lockgate.db'}"
    base_env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCKGATE_NOTES_DIR": str(workdir / "notes"),
        "LOCKGATE_SECRET_NOTES_TOKEN": CANARY,
        "LOCKGATE_INSTANCE_NAME": "sim-proc",
        "LOCKGATE_MAX_DURATION_SECS": "5",
        "PYTHONPATH": str(ROOT),
    }
    for key, value in scenario.settings.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        base_env[f"LOCKGATE_{key.upper()}"] = text
    base_env.pop("LOCKGATE_CRASH_AT", None)
    logs = workdir / "server.log"
    trace: list[str] = []
    kills = 0
    servers: list[ServerProcess] = []
    engine = open_engine(url)
    upgrade(engine)
    key = ApiKeys(SqlStore(engine)).create("sim").secret

    violations: list[Violation] = []
    fired: list[CrashPoint] = []

    def start() -> ServerProcess:
        """Start the server; a point reached during its boot (recovery, the first
        heartbeat) kills it there, and it is started again, as a supervisor would."""
        nonlocal kills
        for _ in range(MAX_RESTARTS + 1):
            env = dict(base_env)
            if point is not None and kills == 0:
                env["LOCKGATE_CRASH_AT"] = point.name
            try:
                with open(logs, "a", encoding="utf-8") as log:
                    server = ServerProcess(env, log)
            except ProcessKilled as killed:
                kills += 1
                if point is not None:
                    fired.append(point)
                trace.append(f"KILLED (SIGKILL) during boot at {point}: {killed}")
                continue
            servers.append(server)
            trace.append(f"server process {server.proc.pid} up on port {server.port}")
            return server
        raise RuntimeError("the server could not be started")

    try:
        client = McpClient(start, key)
        for _ in range(MAX_RESTARTS + 1):
            try:
                scenario.drive(client)  # type: ignore[arg-type]
                trace.append("client done")
                break
            except ProcessKilled as killed:
                kills += 1
                trace.append(f"KILLED (SIGKILL) at {point.name if point else '?'}: {killed}")
                if point is not None:
                    fired.append(point)
                client.server = start()
        for server in servers:
            server.release()
        effects = NotesSource(workdir / "notes").effects()
        server_logs = logs.read_text(encoding="utf-8").splitlines()
        # Real time does not pass beyond the sessions' leases here: a report still waiting
        # for its session's next GET is a durable wait, not a loss.
        violations += check_all(engine, effects, server_logs, CANARY, reports_may_wait=True)
        if violations:
            trace += ["persisted transitions:", *history(engine, [])]
    except ScenarioFailed as failed:
        violations.append(Violation("the client gets only legitimate answers", str(failed)))
    finally:
        for server in servers:
            server.release()
        engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)
    return RunResult(
        scenario=scenario.name,
        plan=(point,) if point else (),
        fired=fired,
        after_last_crash=[],
        reached=set(),
        violations=violations,
        trace=trace,
    )


def sample(
    plans: Sequence[tuple[Scenario, CrashPoint]], size: int | None, seed: int
) -> list[tuple[Scenario, CrashPoint]]:
    """`size` plans drawn with `seed` (all of them when size is None)."""
    if size is None or size >= len(plans):
        return list(plans)
    return random.Random(seed).sample(list(plans), size)
