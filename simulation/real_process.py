"""The real-process simulation: the engine runs in its own process, which is SIGKILLed at the
armed crash point (armed through `LOCKGATE_CRASH_AT`), restarted, and driven through its
real interface; the invariants are then checked on the database and the tools' data.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from machine.db.connect import open_engine
from machine.engine import Action
from machine.errors import LockgateError
from machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionForbidden,
    ExecutionInterrupted,
    ExecutionNotFound,
)
from machine.tools.notes import NotesSource
from machine.views import ExecutionView
from simulation.invariants import Violation, check_all, history
from simulation.scenarios import Scenario, ScenarioFailed
from simulation.sweep import RunResult
from simulation.world import CANARY
from spec import CrashPoint

ROOT = Path(__file__).resolve().parent.parent
MAX_RESTARTS = 3


class ProcessKilled(Exception):
    """The engine process died (SIGKILL at the armed point)."""


class EngineProcess:
    def __init__(self, workdir: Path, env: dict[str, str], log: IO[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simulation.worker"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise ProcessKilled(f"the engine process exited with {self.proc.returncode}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait(timeout=30)
            raise ProcessKilled("the engine process is gone") from None
        return self._read()

    def release(self) -> None:
        """Make sure the process is gone and its pipes are closed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()


_ERRORS: dict[str, Callable[[str, dict[str, Any]], LockgateError]] = {
    "not_found": lambda eid, e: ExecutionNotFound(execution_id=eid),
    "forbidden": lambda eid, e: ExecutionForbidden(execution_id=eid),
    "expired": lambda eid, e: ExecutionExpired(execution_id=eid, deadline=None),
    "already_settled": lambda eid, e: ExecutionAlreadySettled(
        execution_id=eid, status=str(e.get("status", "?")), detail="answered remotely"
    ),
    "interrupted": lambda eid, e: ExecutionInterrupted(
        execution_id=eid, what_ran=e.get("what_ran")
    ),
}


class ProcessClient:
    """The scenario client, talking to the engine process; the same surface as `Client`."""

    def __init__(self, start: Callable[[], EngineProcess], principal: str = "alice") -> None:
        self.start = start
        self.process = start()
        self.principal = principal
        self.memory: dict[str, Any] = {}

    def remember(self, key: str, compute: Any) -> Any:
        if key not in self.memory:
            self.memory[key] = compute()
        return self.memory[key]

    def _view(self, command: dict[str, Any]) -> ExecutionView:
        answer = self.process.call({"principal": self.principal, **command})
        if "error" in answer:
            error = answer["error"]
            make = _ERRORS.get(str(error.get("code")))
            if make is None:
                raise ScenarioFailed(f"unexpected error: {error}")
            raise make(str(command.get("execution_id", "")), error)
        return ExecutionView.model_validate(answer["view"])

    def execute(self, code: str) -> ExecutionView:
        return self._view({"op": "execute", "code": code})

    def resume(self, execution_id: str, action: Action) -> ExecutionView:
        return self._view({"op": "resume", "execution_id": execution_id, "action": str(action)})

    def get(self, execution_id: str) -> ExecutionView:
        return self._view({"op": "get", "execution_id": execution_id})


def run_in_process(
    scenario: Scenario, point: CrashPoint | None, database_url: str | None = None
) -> RunResult:
    """One scenario against a real engine process killed at `point`."""
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
        base_env[f"LOCKGATE_{key.upper()}"] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    base_env.pop("LOCKGATE_CRASH_AT", None)
    logs = workdir / "engine.log"
    trace: list[str] = []
    kills = 0
    processes: list[EngineProcess] = []

    def start() -> EngineProcess:
        env = dict(base_env)
        if point is not None and kills == 0:
            env["LOCKGATE_CRASH_AT"] = point.name
        with open(logs, "a", encoding="utf-8") as log:
            process = EngineProcess(workdir, env, log)
        processes.append(process)
        trace.append(f"engine process {process.proc.pid} up (incarnation {process.ready})")
        return process

    violations: list[Violation] = []
    fired: list[CrashPoint] = []
    try:
        client = ProcessClient(start)
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
                client.process = start()
        client.process.stop()
        engine = open_engine(url)
        try:
            effects = NotesSource(workdir / "notes").effects()
            violations += check_all(
                engine, effects, logs.read_text(encoding="utf-8").splitlines(), CANARY
            )
            if violations:
                trace += ["persisted transitions:", *history(engine, [])]
        finally:
            engine.dispose()
    except ScenarioFailed as failed:
        violations.append(Violation("the client gets only legitimate answers", str(failed)))
    finally:
        for process in processes:
            process.release()
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
