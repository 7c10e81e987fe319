"""Real engine processes for the restart tests, and the test's own reads of their database.

`Procs` starts `python -m tests.support.procs.engine_process` (configured through
environment variables only, like a deployment) on one database and one notes directory,
reads each process's JSON answer, and runs commands that must die by SIGKILL at a named
crash point (`LOCKGATE_CRASH_AT`); `Db` reads the executions, tool calls, instances and
transition log the processes share. `DISPATCH` names the crash points of a call's dispatch,
and `LIST_ONCE` a program that makes one idempotent call.

A pytest plugin: test modules load the fixtures `procs` and `db` (both on the test's
`database_url`) with `pytest_plugins = ["tests.support.engine_processes"]`, and import the
helpers from here before pytest registers the plugin, hence PYTEST_DONT_REWRITE (as in
`tests.support.servers`).

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine as SqlEngine
from sqlmodel import Session, col, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Execution, Instance, ToolCall, TransitionLog
from lockgate.machine.tools.notes import NotesSource
from tests.support.process_env import lockgate_env

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = "tests.support.procs.engine_process"
#: Any one process must finish (or print its line) within this many seconds.
PROCESS_TIMEOUT = 60.0

LIST_ONCE = 'keys = tools.notes.list()\n{"keys": keys, "done": True}'

DISPATCH = "tool_call:dispatch:approved->dispatched"


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float = PROCESS_TIMEOUT) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            pytest.fail(f"process {self.pid} did not finish in {timeout:g} s:\n{self.stderr()}")

    def read_line(self, timeout: float = PROCESS_TIMEOUT) -> Any:
        """The JSON line the process prints (while it may go on running)."""
        assert self.popen.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.popen.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                pytest.fail(
                    f"process {self.pid} printed nothing in {timeout:g} s:\n{self.stderr()}"
                )
        line = self.popen.stdout.readline()
        if not line:
            self.popen.wait(timeout=10)
            pytest.fail(
                f"process {self.pid} exited ({self.popen.returncode}) without an answer:\n"
                f"{self.stderr()}"
            )
        return json.loads(line)

    def sigkill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        assert self.wait() == -signal.SIGKILL


@dataclass
class Procs:
    """Starts engine processes on one database and one notes directory."""

    database_url: str
    notes_dir: Path
    logs_dir: Path
    started: list[Proc] = field(default_factory=list)

    def env(self, overrides: dict[str, str]) -> dict[str, str]:
        env = lockgate_env(
            self.database_url,
            self.notes_dir,
            LOCKGATE_LEASE_TTL="PT1S",
            LOCKGATE_HEARTBEAT_INTERVAL="PT0.2S",
            LOCKGATE_MAX_DURATION_SECS="10",
        )
        env.update(overrides)
        return env

    def start(self, *args: str, **env: str) -> Proc:
        stderr_path = self.logs_dir / f"proc-{len(self.started)}.stderr"
        with open(stderr_path, "w", encoding="utf-8") as stderr:
            popen = subprocess.Popen(
                [sys.executable, "-m", PROGRAM, *args],
                cwd=ROOT,
                env=self.env(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        proc = Proc(popen, stderr_path)
        self.started.append(proc)
        return proc

    def run(self, *args: str, **env: str) -> Any:
        """Run a command to its end; returns its JSON answer."""
        [answer] = self.finish([self.start(*args, **env)])
        return answer

    def finish(self, started: list[Proc]) -> list[Any]:
        """The answers of processes already started, once each exited cleanly."""
        answers = [proc.read_line() for proc in started]
        for proc in started:
            code = proc.wait()
            assert code == 0, f"exit code {code}:\n{proc.stderr()}"
        return answers

    def crash(self, *args: str, crash_at: str, **env: str) -> Proc:
        """Run a command that must die by SIGKILL at `crash_at`, before answering."""
        proc = self.start(*args, LOCKGATE_CRASH_AT=crash_at, LOCKGATE_FAULT_INJECTION="true", **env)
        code = proc.wait()
        assert code == -signal.SIGKILL, f"expected a SIGKILL, got {code}:\n{proc.stderr()}"
        assert proc.popen.stdout is not None
        assert proc.popen.stdout.read() == "", "the process answered before its crash point"
        return proc

    def effects(self) -> list[dict[str, Any]]:
        return NotesSource(self.notes_dir).effects()

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(timeout=30)
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()


class Db:
    """The test's own reads of the database the processes share."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: SqlEngine | None = None

    @property
    def engine(self) -> SqlEngine:
        # Opened on first use, after a process created (and, on SQLite, migrated) it.
        if self._engine is None:
            self._engine = open_engine(self.url)
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()

    def execution(self, execution_id: str) -> Execution:
        with Session(self.engine) as s:
            row = s.get(Execution, execution_id)
            assert row is not None, f"no execution {execution_id}"
            return row

    def executions(self) -> list[Execution]:
        with Session(self.engine) as s:
            return list(s.exec(select(Execution).order_by(col(Execution.created_at))))

    def only_execution(self) -> Execution:
        rows = self.executions()
        assert len(rows) == 1, [r.id for r in rows]
        return rows[0]

    def calls(self, execution_id: str) -> list[ToolCall]:
        with Session(self.engine) as s:
            query = select(ToolCall).where(ToolCall.execution_id == execution_id)
            return list(s.exec(query.order_by(col(ToolCall.seq))))

    def instance(self, instance_id: str) -> Instance:
        with Session(self.engine) as s:
            row = s.get(Instance, instance_id)
            assert row is not None, f"no instance {instance_id}"
            return row

    def instance_of(self, pid: int) -> Instance:
        with Session(self.engine) as s:
            rows = list(s.exec(select(Instance).where(Instance.pid == pid)))
        assert len(rows) == 1, f"process {pid} has {len(rows)} instance rows"
        return rows[0]

    def log(self, record_id: str, event: str | None = None) -> list[TransitionLog]:
        with Session(self.engine) as s:
            query = select(TransitionLog).where(TransitionLog.record_id == record_id)
            if event is not None:
                query = query.where(TransitionLog.event == event)
            return list(s.exec(query.order_by(col(TransitionLog.id))))

    def events(self, record_id: str) -> list[str]:
        return [entry.event for entry in self.log(record_id)]


@pytest.fixture(name="procs")
def procs_fixture(database_url: str, tmp_path: Path) -> Iterator[Procs]:
    logs = tmp_path / "logs"
    logs.mkdir()
    started = Procs(database_url, tmp_path / "notes", logs)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture(name="db")
def db_fixture(database_url: str) -> Iterator[Db]:
    opened = Db(database_url)
    try:
        yield opened
    finally:
        opened.close()


def effects_of(procs: Procs, tool: str) -> list[dict[str, Any]]:
    return [e for e in procs.effects() if e["tool"] == tool]
