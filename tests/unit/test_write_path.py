"""The one write path (`machine/write_path.py`) on the real store: what it refuses, what it
commits, when it runs an external effect, and what it hands back.

Records are real rows (sessions and owed requests made through `Sessions`, on SQLite and
PostgreSQL); every assertion reads what was committed, or the error a caller gets.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection
from sqlmodel import select

import lockgate.spec as spec
from lockgate.machine.db.schema import Execution, OwedRequest, Session
from lockgate.machine.engine import record_of
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.machines import build_machines
from lockgate.machine.records import Record
from lockgate.machine.runtime import Runtime
from lockgate.machine.write_path import Applied, Step, WritePath
from lockgate.spec import CrashPoint
from tests.support.memory_store import MemoryStore
from tests.support.spec_factories import without_transition

MakeRuntime = Callable[..., Runtime]


def session_record(runtime: Runtime, session_id: str) -> Record:
    """A fresh record of the session's row, as the write path takes it."""
    row = runtime.sessions.get(session_id)
    assert row is not None
    return Record("session", row.id, row.status, row.version, row.model_dump())


def opened(runtime: Runtime, session_id: str = "s") -> Record:
    """An active session (its initialize is being answered)."""
    runtime.sessions.open(session_id, "alice", "2025-11-25", {"name": "t", "version": "1"}, {})
    return session_record(runtime, session_id)


def owed_status(runtime: Runtime, owed: Record) -> str:
    with runtime.engine.store.session() as s:
        row = s.get(OwedRequest, owed.id)
    assert row is not None
    return row.status


def session_status(runtime: Runtime, session_id: str) -> str:
    with runtime.engine.store.session() as s:
        row = s.get(Session, session_id)
    assert row is not None
    return row.status


def test_a_status_or_version_is_never_set_as_plain_data(make_runtime: MakeRuntime) -> None:
    record = opened(make_runtime())
    with pytest.raises(ValueError) as refused:
        Step(record, "end_request", data={"version": 9, "status": "closed"})
    assert str(refused.value) == "['status', 'version'] change only through a transition"
    Step(record, "end_request", data={"incarnation": 2})  # other columns ride along


def test_apply_needs_a_step(make_runtime: MakeRuntime) -> None:
    with pytest.raises(ValueError) as refused:
        make_runtime().engine.write.apply()
    assert str(refused.value) == "apply needs at least one step"


def test_two_external_effects_never_share_a_transaction(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    first = runtime.ledger.owe("s", 1, "tools/call", None)
    second = runtime.ledger.owe("s", 2, "tools/call", None)
    ran: list[str] = []
    with pytest.raises(ValueError) as refused:
        runtime.engine.write.apply(
            Step(first, "answer"), Step(second, "answer"), effect=lambda: ran.append("x")
        )
    assert str(refused.value) == "one transaction may carry at most one external effect"
    assert ran == []
    assert [owed_status(runtime, o) for o in (first, second)] == ["owed", "owed"]


def test_a_transition_with_an_external_effect_needs_the_effect(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    with pytest.raises(ValueError) as refused:
        runtime.engine.write.apply(Step(owed, "answer"))
    assert str(refused.value) == "'answer' needs its external effect to run"
    assert owed_status(runtime, owed) == "owed"


def test_an_effect_without_a_transition_declaring_one_is_refused(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    ran: list[str] = []
    with pytest.raises(ValueError) as refused:
        runtime.engine.write.apply(Step(owed, "lose"), effect=lambda: ran.append("x"))
    assert str(refused.value) == "an effect was given but no transition here declares one"
    assert ran == [] and owed_status(runtime, owed) == "owed"


def test_an_effect_first_transition_runs_its_effect_once_and_returns_its_result(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    ran: list[str] = []

    def write_response() -> str:
        ran.append("written")
        return "sent"

    applied = runtime.engine.write.apply(Step(owed, "answer"), effect=write_response)
    assert ran == ["written"]
    assert applied.effect_result == "sent"
    [change] = applied.changes
    assert (change.record_id, change.source, change.dest) == (owed.id, "owed", "answered")
    assert [(t.event, t.dest) for t in applied.transitions] == [("answer", "answered")]
    assert owed_status(runtime, owed) == "answered"
    assert (owed.status, owed.version) == ("answered", 1)  # the caller's record moved too


def test_without_an_effect_there_is_no_effect_result(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    applied: Applied[None] = runtime.engine.write.apply(Step(owed, "lose"))
    assert applied.effect_result is None
    assert [c.dest for c in applied.changes] == ["lost"]


def test_a_fenced_write_conflicts_once_the_fence_moved(make_runtime: MakeRuntime) -> None:
    """A write fenced on a record commits only while that record is still at the version
    the writer read; otherwise nothing of the transaction is written."""
    runtime = make_runtime()
    session = opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    stale = Record(session.machine, session.id, session.status, session.version, {})
    runtime.engine.write.apply(Step(session, "end_request"))  # the session moved on
    with pytest.raises(Conflict):
        runtime.engine.write.apply(Step(owed, "lose"), fence=stale)
    assert owed_status(runtime, owed) == "owed"
    runtime.engine.write.apply(Step(owed, "lose"), fence=session)  # the current version
    assert owed_status(runtime, owed) == "lost"


class RecordingWrite:
    """A store-level write (as using up an approval link is): it notes the transaction it
    ran in, and refuses when told to, as a used link does."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.ran_in_transaction: list[bool] = []

    def write(self, conn: Connection) -> None:
        self.ran_in_transaction.append(conn.in_transaction())
        if self.refuse:
            raise LookupError("this link was used already")


def test_a_store_write_commits_in_its_transition_s_transaction_or_not_at_all(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    owed = runtime.ledger.owe(opened(runtime).id, 1, "tools/call", None)
    refused = RecordingWrite(refuse=True)
    with pytest.raises(LookupError):
        runtime.engine.write.apply(Step(owed, "lose"), writes=[refused])
    assert refused.ran_in_transaction == [True]
    assert owed_status(runtime, owed) == "owed"  # the write's refusal rolled it back
    used = RecordingWrite()
    runtime.engine.write.apply(Step(owed, "lose"), writes=[used])
    assert used.ran_in_transaction == [True]
    assert owed_status(runtime, owed) == "lost"


def test_a_store_write_is_not_made_when_the_transition_s_fence_moved(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    session = opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    stale = Record(session.machine, session.id, session.status, session.version, {})
    runtime.engine.write.apply(Step(session, "end_request"))
    write = RecordingWrite(refuse=True)  # it would refuse if it ran: the fence goes first
    with pytest.raises(Conflict):
        runtime.engine.write.apply(Step(owed, "lose"), fence=stale, writes=[write])
    assert write.ran_in_transaction == []
    assert owed_status(runtime, owed) == "owed"


def test_the_memory_store_refuses_a_store_write_with_a_clear_error() -> None:
    store = MemoryStore()
    store.insert(Record("session", "s", "active", 1, {}))
    path = WritePath(store)
    with pytest.raises(TypeError) as refused:
        path.apply(Step(store.get("session", "s"), "end_request"), writes=[RecordingWrite()])
    assert str(refused.value) == "the memory store carries no store-level writes but Grow"
    assert store.get("session", "s").version == 1


def test_the_default_clock_writes_utc_timestamps(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    record = opened(runtime)
    before = datetime.now(UTC)
    applied: Applied[None] = WritePath(runtime.engine.store).apply(Step(record, "end_request"))
    [change] = applied.changes
    touched = change.updates["last_activity"]
    assert isinstance(touched, datetime) and touched.tzinfo is not None
    assert before <= touched <= datetime.now(UTC)
    assert session_status(runtime, "s") == "idle"


def test_recovery_is_not_conservative_unless_asked(make_runtime: MakeRuntime) -> None:
    """The default write path lets recovery requeue an execution; a conservative one only
    lets it interrupt."""
    started = CrashPoint.parse("execution:start:pending->running:after_commit")
    runtime = make_runtime(faults=Faults([started]))
    with pytest.raises(InjectedCrash):
        runtime.engine.execute("alice", "1 + 1")
    with runtime.engine.store.session() as s:
        [row] = s.exec(select(Execution))
    execution = record_of(row)
    assert execution.status == "running"
    with pytest.raises(GuardRefused):
        WritePath(runtime.engine.store, conservative=True).apply(Step(execution, "requeue"))
    WritePath(runtime.engine.store).apply(Step(execution, "requeue"))
    assert execution.status == "pending"


def test_the_machines_given_are_the_ones_obeyed(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    record = opened(runtime)
    runtime.engine.write.apply(Step(record, "end_request"))
    machine = without_transition(spec.MACHINES["session"], "begin_request")
    narrowed = WritePath(
        runtime.engine.store, machines=build_machines({**spec.MACHINES, "session": machine})
    )
    with pytest.raises(IllegalTransition) as refused:
        narrowed.apply(Step(record, "begin_request"))
    # The error names the record, so an operator can find it.
    assert str(refused.value).startswith("session s: 'begin_request' is not a transition")
    assert session_status(runtime, "s") == "idle"


def test_observers_are_told_each_committed_transaction(make_runtime: MakeRuntime) -> None:
    """What the metrics see: every committed transaction's changes, once; nothing of a
    write that conflicted."""
    runtime = make_runtime()
    session = opened(runtime)
    owed = runtime.ledger.owe("s", 1, "tools/call", None)
    seen: list[list[tuple[str, str, str]]] = []
    runtime.engine.write.observers.append(
        lambda changes: seen.append([(c.record_id, c.source, c.dest) for c in changes])
    )
    stale = Record(session.machine, session.id, session.status, session.version, {})
    runtime.engine.write.apply(Step(session, "end_request"), Step(owed, "lose"))
    with pytest.raises(Conflict):
        runtime.engine.write.apply(Step(stale, "close"))
    assert seen == [[("s", "active", "idle"), (owed.id, "owed", "lost")]]


@pytest.mark.parametrize("machine", ["execution", "instance", "session", "owed_request"])
def test_a_row_created_alone_passes_its_creation_crash_points(
    make_runtime: MakeRuntime, machine: str
) -> None:
    """Executions queued by `submit`, instances, sessions and owed requests are inserted in a
    transaction of their own: that commit is a crash point like any transition's."""
    faults = Faults()
    runtime = make_runtime(faults=faults)
    opened(runtime)
    runtime.ledger.owe("s", "1", "tools/call", None)
    runtime.engine.submit("alice", "1")
    before, after = spec.creation_points(spec.MACHINES[machine])
    initial = spec.MACHINES[machine].initial.name
    assert before.name == f"{machine}:create:new->{initial}:before_commit"
    assert faults.hits[before] >= 1 and faults.hits[after] >= 1
    assert spec.creation_points(spec.TOOL_CALL) == ()  # inserted with its checkpoint only


def test_a_crash_before_a_queued_execution_commits_leaves_nothing_after_it_a_pending_row(
    make_runtime: MakeRuntime,
) -> None:
    before, after = spec.creation_points(spec.EXECUTION)
    runtime = make_runtime(faults=Faults([before]))
    with pytest.raises(InjectedCrash):
        runtime.engine.submit("alice", "1")
    with runtime.engine.store.session() as s:
        assert s.exec(select(Execution)).all() == []
    runtime.engine.write.faults = Faults([after])
    with pytest.raises(InjectedCrash):
        runtime.engine.submit("alice", "2")
    with runtime.engine.store.session() as s:
        rows = s.exec(select(Execution)).all()
    assert [(r.code, r.status) for r in rows] == [("2", "pending")]


def test_create_refuses_a_row_that_is_only_inserted_with_a_transition(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    with pytest.raises(ValueError, match="only ever inserted with a transition"):
        runtime.engine.write.create("tool_call", object())
