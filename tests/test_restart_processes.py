"""The durable engine across REAL processes: started with subprocess, killed with SIGKILL.

Each test drives `python -m tests.support.procs.engine_process` (configured through environment
variables only, like a deployment) against one database, SQLite file and PostgreSQL alike,
and checks the database, the processes' answers and the notes tool's on-disk effect log
(`effects.jsonl`, written by the tool itself, so it counts effects that really happened).
Crashes are real: `LOCKGATE_CRASH_AT` (with `LOCKGATE_FAULT_INJECTION` on) makes the process
SIGKILL itself at a named crash point of the write path, or the test SIGKILLs a process that
holds.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine as SqlEngine
from sqlmodel import Session, col, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Execution, Instance, ToolCall, TransitionLog
from lockgate.machine.tools.notes import NotesSource
from tests.support.polling import wait_for
from tests.support.process_env import lockgate_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = "tests.support.procs.engine_process"
#: Any one process must finish (or print its line) within this many seconds.
PROCESS_TIMEOUT = 60.0

WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'
LIST_ONCE = 'keys = tools.notes.list()\n{"keys": keys, "done": True}'
LIST_TWICE = (
    "print('first')\na = tools.notes.list()\nprint('second')\nb = tools.notes.list()\n[a, b]"
)

DISPATCH = "tool_call:dispatch:approved->dispatched"
SUCCEED = "tool_call:succeed:dispatched->succeeded"


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


@pytest.fixture
def procs(database_url: str, tmp_path: Path) -> Iterator[Procs]:
    logs = tmp_path / "logs"
    logs.mkdir()
    started = Procs(database_url, tmp_path / "notes", logs)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def db(database_url: str) -> Iterator[Db]:
    opened = Db(database_url)
    try:
        yield opened
    finally:
        opened.close()


def effects_of(procs: Procs, tool: str) -> list[dict[str, Any]]:
    return [e for e in procs.effects() if e["tool"] == tool]


def assert_paused_on_write(view: dict[str, Any]) -> str:
    assert view["status"] == "waiting_for_interaction", view
    pending = view["pending"]
    assert pending["seq"] == 1
    assert pending["tool"] == "notes.write"
    assert pending["arguments_preview"] == {"key": "k", "text": "v"}
    assert view["calls"] == [{"seq": 1, "tool": "notes.write", "status": "awaiting_approval"}]
    execution_id: str = view["id"]
    return execution_id


# -- a, g: a pause survives SIGKILL -----------------------------------------------------------


def test_pause_survives_sigkill_of_a_live_instance(procs: Procs, db: Db) -> None:
    holder = procs.start("execute", "--hold", WRITE_THEN_READ)
    paused = holder.read_line()
    execution_id = assert_paused_on_write(paused)

    # The holder is a live instance: its lease is being renewed by its heartbeat thread.
    first = db.instance_of(holder.pid)
    wait_for(
        lambda: db.instance(first.id).lease_until > first.lease_until,
        "the holding process to renew its lease",
    )
    holder.sigkill()

    # (g) Nothing is stranded: a fresh process (another instance) sees the pause as it was.
    seen = procs.run("get", execution_id, "alice", LOCKGATE_INSTANCE_NAME="g")
    assert assert_paused_on_write(seen) == execution_id
    assert seen["pending"] == paused["pending"]
    assert procs.effects() == [], "no call may run before the approval"

    # (a) A new process under the same name declares the killed incarnation dead at once and
    # finishes the execution from its stored snapshot.
    resumed = procs.start("resume", execution_id, "alice", "accept")
    [view] = procs.finish([resumed])
    assert view["status"] == "completed", view
    assert view["result"] == {"key": "k", "text": "v"}
    assert [c["status"] for c in view["calls"]] == ["succeeded", "succeeded"]
    assert db.instance(first.id).status == "dead"

    writes = effects_of(procs, "notes.write")
    assert len(writes) == 1, writes
    assert writes[0]["idempotency_key"] == f"{execution_id}:1"
    assert writes[0]["pid"] == resumed.pid
    assert [e["tool"] for e in procs.effects()] == ["notes.write", "notes.read"]

    # A repeated decision answers with the same settled outcome and runs nothing again.
    again = procs.run("resume", execution_id, "alice", "accept")
    assert again["status"] == "completed"
    assert again["result"] == {"key": "k", "text": "v"}
    assert len(procs.effects()) == 2


# -- b: a crash mid-dispatch of a non-idempotent call ----------------------------------------


def test_crash_after_a_write_ran_ends_interrupted_and_never_repeats_it(
    procs: Procs, db: Db
) -> None:
    execution_id = assert_paused_on_write(procs.run("execute", WRITE_THEN_READ))
    crashed = procs.crash(
        "resume", execution_id, "alice", "accept", crash_at=f"{DISPATCH}:after_effect"
    )

    # The intent was committed, the write ran, the result never was.
    assert db.execution(execution_id).status == "running"
    assert [c.status for c in db.calls(execution_id)] == ["dispatched"]
    writes = effects_of(procs, "notes.write")
    assert [w["pid"] for w in writes] == [crashed.pid]

    report = procs.run("recover")
    assert report["interrupted"] == [execution_id]
    assert report["requeued"] == []
    assert db.instance_of(crashed.pid).id in report["declared_dead"]

    in_doubt = {"seq": 1, "tool": "notes.write"}
    # Two more processes, at once (neither changes anything): a read, and a decision.
    view, refused = procs.finish(
        [
            procs.start("get", execution_id, "alice", LOCKGATE_INSTANCE_NAME="g"),
            procs.start("resume", execution_id, "alice", "accept", LOCKGATE_INSTANCE_NAME="r"),
        ]
    )
    assert view["status"] == "interrupted", view
    assert view["what_ran"] == {
        "calls": [{**in_doubt, "status": "in_doubt"}],
        "in_doubt": [in_doubt],
    }
    assert view["calls"] == [{**in_doubt, "status": "in_doubt"}]
    assert view["result"] is None

    assert refused["error"]["code"] == "interrupted", refused
    assert refused["error"]["what_ran"]["in_doubt"] == [in_doubt]

    # Exactly once: the write that ran before the crash, and never again.
    assert effects_of(procs, "notes.write") == writes
    assert effects_of(procs, "notes.read") == []
    assert "redispatch" not in db.events(f"{execution_id}:1")


# -- c: a crash mid-dispatch of an idempotent call --------------------------------------------


@pytest.mark.parametrize(
    ("phase", "dispatches"),
    [
        # The intent was committed, the effect never happened: it runs once, on recovery.
        ("after_commit", 1),
        # The effect happened, its result was lost: at-least-once for an idempotent tool,
        # the second call carrying the same idempotency key.
        ("after_effect", 2),
    ],
)
def test_crash_mid_dispatch_of_an_idempotent_call_is_retried(
    procs: Procs, db: Db, phase: str, dispatches: int
) -> None:
    crashed = procs.crash("execute", LIST_ONCE, crash_at=f"{DISPATCH}:{phase}")
    execution_id = db.only_execution().id
    assert db.execution(execution_id).status == "running"
    assert [c.status for c in db.calls(execution_id)] == ["dispatched"]

    report = procs.run("recover")  # the boot round recovers, then runs the pending work
    assert report["requeued"] == [execution_id]
    assert report["interrupted"] == []

    row = db.execution(execution_id)
    assert row.status == "completed", row
    assert row.outcome == {"result": {"keys": [], "done": True}}
    [call] = db.calls(execution_id)
    assert call.status == "succeeded"
    assert call.attempts == 2
    assert db.events(call.id).count("redispatch") == 1

    lists = effects_of(procs, "notes.list")
    assert len(lists) == dispatches, lists
    assert {e["idempotency_key"] for e in lists} == {f"{execution_id}:1"}
    assert lists[-1]["pid"] != crashed.pid


# -- d: a crash between two calls goes on from the checkpoint ---------------------------------


def test_crash_between_calls_goes_on_without_redoing_the_first(procs: Procs, db: Db) -> None:
    """Recovery goes on from the checkpoint at call 1, not from the top (a replay that
    answers call 1 from the journal would give the same result and the same effects): the
    line printed before the checkpoint is in the logs once, and only the recovering process
    ran anything after the crash."""
    crashed = procs.crash("execute", LIST_TWICE, crash_at=f"{SUCCEED}:after_commit")
    execution_id = db.only_execution().id
    assert [c.status for c in db.calls(execution_id)] == ["succeeded"]
    at_crash = db.execution(execution_id)
    assert (at_crash.status, at_crash.snapshot_call, at_crash.logs) == ("running", 1, "first\n")

    recovering = procs.start("recover")
    [report] = procs.finish([recovering])
    assert report["requeued"] == [execution_id]

    row = db.execution(execution_id)
    assert row.status == "completed", row
    assert row.outcome == {"result": [[], []]}
    assert row.logs == "first\nsecond\n"
    assert [c.status for c in db.calls(execution_id)] == ["succeeded", "succeeded"]
    lists = effects_of(procs, "notes.list")
    assert [e["idempotency_key"] for e in lists] == [f"{execution_id}:1", f"{execution_id}:2"]
    assert [e["pid"] for e in lists] == [crashed.pid, recovering.pid]
    assert db.events(f"{execution_id}:1") == ["auto_approve", "dispatch", "succeed"]
    assert db.events(execution_id) == [
        *["start", "checkpoint"],  # the killed process, up to call 1
        *["requeue", "start", "checkpoint", "complete"],  # the recovering one, from call 1
    ]


# -- e: conservative recovery retries nothing -------------------------------------------------


def test_conservative_recovery_interrupts_even_an_idempotent_call(procs: Procs, db: Db) -> None:
    procs.crash("execute", LIST_ONCE, crash_at=f"{DISPATCH}:after_commit")
    execution_id = db.only_execution().id

    report = procs.run("recover", LOCKGATE_CONSERVATIVE_RECOVERY="true")
    assert report["interrupted"] == [execution_id]
    assert report["requeued"] == []

    row = db.execution(execution_id)
    assert row.status == "interrupted"
    in_doubt = {"seq": 1, "tool": "notes.list"}
    assert row.what_ran == {"calls": [{**in_doubt, "status": "in_doubt"}], "in_doubt": [in_doubt]}
    assert effects_of(procs, "notes.list") == [], "the call was never made, and never retried"


# -- f: several instances on one PostgreSQL database ------------------------------------------


def postgres_only(database_url: str) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("several instances share a PostgreSQL database; SQLite is one box")


def test_a_dead_instance_work_is_left_alone_until_its_lease_lapses(
    procs: Procs, db: Db, database_url: str
) -> None:
    postgres_only(database_url)
    live = procs.start("serve", LOCKGATE_INSTANCE_NAME="b")
    serving = live.read_line()["serving"]

    crashed = procs.crash(
        "execute",
        LIST_ONCE,
        crash_at=f"{DISPATCH}:after_commit",
        LOCKGATE_INSTANCE_NAME="a",
        LOCKGATE_LEASE_TTL="PT3S",
    )
    dead = db.instance_of(crashed.pid)
    execution_id = db.only_execution().id

    # While the crashed instance's lease holds, the live one (recovering every 0.2 s) must
    # not touch its execution.
    observed = 0
    while True:
        row = db.execution(execution_id)
        if datetime.now(UTC) >= dead.lease_until:
            break  # this read may have come after the lease lapsed: it proves nothing
        assert (row.status, row.owner) == ("running", dead.id)
        observed += 1
        time.sleep(0.05)
    assert observed, "the lease lapsed before the test could look (the machine is too slow)"

    # Once it lapses, the live instance declares it dead and finishes its work.
    wait_for(
        lambda: db.execution(execution_id).status == "completed",
        "the live instance to recover the execution",
    )
    [declared] = db.log(dead.id, "declare_dead")
    [requeued] = db.log(execution_id, "requeue")
    assert declared.at >= dead.lease_until
    assert requeued.at >= dead.lease_until
    assert db.log(execution_id, "interrupt") == []
    assert db.execution(execution_id).outcome == {"result": {"keys": [], "done": True}}
    assert [e["pid"] for e in effects_of(procs, "notes.list")] == [live.pid]
    assert db.instance(serving).status == "live"


def test_two_instances_recovering_at_once_recover_each_execution_once(
    procs: Procs, db: Db, database_url: str, tmp_path: Path
) -> None:
    postgres_only(database_url)
    count = 10
    crashed = procs.crash(
        "execute",
        "--parallel",
        str(count),
        LIST_ONCE,
        crash_at=f"{DISPATCH}:after_commit",
        LOCKGATE_INSTANCE_NAME="orphans",
    )
    dead = db.instance_of(crashed.pid)
    orphans = {row.id for row in db.executions()}
    assert len(orphans) == count
    for execution_id in orphans:
        assert (db.execution(execution_id).status, db.execution(execution_id).owner) == (
            "running",
            dead.id,
        )
    wait_for(lambda: datetime.now(UTC) > dead.lease_until, "the dead instance's lease to lapse")

    # Both get ready, then both boot (and recover) at the same moment.
    gate = tmp_path / "gate"
    gate.mkdir()
    recoverers = [
        procs.start("recover", LOCKGATE_INSTANCE_NAME=name, ENGINE_PROCESS_GATE=str(gate))
        for name in ("b", "c")
    ]
    wait_for(lambda: len(list(gate.glob("ready-*"))) == 2, "both recoverers to get ready")
    (gate / "go").touch()
    reports = procs.finish(recoverers)

    requeued = [set(report["requeued"]) for report in reports]
    assert requeued[0] | requeued[1] == orphans
    assert requeued[0] & requeued[1] == set(), "an execution was requeued twice"
    assert sum(dead.id in report["declared_dead"] for report in reports) == 1
    for execution_id in orphans:
        events = db.events(execution_id)
        assert events.count("requeue") == 1, events
        assert "interrupt" not in events
        assert events.count("start") == 2, events  # the crashed run, and one after requeue
        assert db.execution(execution_id).status == "completed"
    keys = sorted(e["idempotency_key"] for e in effects_of(procs, "notes.list"))
    assert keys == sorted(f"{execution_id}:1" for execution_id in orphans)
