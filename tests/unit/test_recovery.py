"""Recovery of a dead instance's live work (`machine/recovery.py`), case by case, on the real
store: which executions are taken over, requeued or interrupted, what becomes of their calls,
what the round reports and logs.

The orphans are rows as a crashed instance leaves them (an execution running under an owner
that holds no lease, its journal in whatever state the crash left it), written straight to
the database: the cases are exactly the ones named, whatever order the rows are stored in.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from sqlmodel import select

from lockgate.machine.db.schema import Execution, Instance, ToolCall
from lockgate.machine.engine import record_of
from lockgate.machine.faults import Faults
from lockgate.machine.runtime import Runtime
from lockgate.machine.write_path import Step
from lockgate.spec import CrashPoint
from lockgate.spec import ExecutionStatus as E
from tests.support.sessions import FakeClock

MakeRuntime = Callable[..., Runtime]

#: A call as the crash left it: (sequence, tool, status, idempotent).
CallRow = tuple[int, str, str, bool]


#: The journal's path from `requested` to each state a crash can leave a call in.
PATHS = {
    "requested": (),
    "approved": ("auto_approve",),
    "dispatched": ("auto_approve", "dispatch"),
    "succeeded": ("auto_approve", "dispatch", "succeed"),
    "in_doubt": ("auto_approve", "dispatch", "mark_in_doubt"),
}


def orphan(runtime: Runtime, calls: Sequence[CallRow] = (), owner: str = "gone") -> str:
    """An execution left running by `owner` (an instance holding no lease), with `calls`
    stored in the order given, each moved along the spec's edges to its status."""
    now = runtime.engine.clock()
    write = runtime.engine.write
    execution_id = uuid.uuid4().hex
    row = Execution(
        id=execution_id,
        principal_id="alice",
        status=E.PENDING.value,
        code="tools.notes.list()",
        created_at=now,
        updated_at=now,
    )
    runtime.engine.store.commit([], [row])
    started = record_of(row)
    write.apply(Step(started, "start", {"owner": owner}))
    for seq, tool, status, idempotent in calls:
        call = ToolCall(
            id=f"{execution_id}:{seq}",
            execution_id=execution_id,
            seq=seq,
            tool=tool,
            status="requested",
            idempotent=idempotent,
            created_at=now,
            updated_at=now,
        )
        runtime.engine.store.commit([], [call])
        journal = record_of(call)
        for event in PATHS[status]:
            effect = (lambda: None) if event == "dispatch" else None
            given: dict[str, object] = {"result": {"value": []}} if event == "succeed" else {}
            # As the engine writes them: only while its execution is still where it was.
            write.apply(Step(journal, event, given), effect=effect, fence=started)
    return execution_id


def execution(runtime: Runtime, execution_id: str) -> Execution:
    with runtime.engine.store.session() as s:
        row = s.get(Execution, execution_id)
    assert row is not None
    return row


def call_statuses(runtime: Runtime, execution_id: str) -> dict[int, str]:
    with runtime.engine.store.session() as s:
        rows = s.exec(select(ToolCall).where(ToolCall.execution_id == execution_id))
        return {row.seq: row.status for row in rows}


def test_an_execution_that_died_before_any_call_is_requeued(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    lost = orphan(runtime)
    report = runtime.recovery.run()
    assert (report.requeued, report.interrupted) == ([lost], [])
    row = execution(runtime, lost)
    assert row.status == E.PENDING and row.owner is None


def test_a_non_idempotent_call_that_finished_is_not_in_doubt(make_runtime: MakeRuntime) -> None:
    """The write succeeded before the crash (its result is journaled): nothing is in doubt,
    the execution goes on from its checkpoint."""
    runtime = make_runtime()
    lost = orphan(runtime, [(1, "notes.write", "succeeded", False)])
    assert runtime.recovery.run().requeued == [lost]
    assert call_statuses(runtime, lost) == {1: "succeeded"}


def test_the_latest_call_is_the_highest_sequence_whatever_the_storage_order(
    make_runtime: MakeRuntime,
) -> None:
    """Call 2 (a write, dispatched when the instance died) stored before call 1: it is
    still the one in doubt, and the execution ends interrupted naming it."""
    runtime = make_runtime()
    lost = orphan(
        runtime,
        [(2, "notes.write", "dispatched", False), (1, "notes.list", "succeeded", True)],
    )
    assert runtime.recovery.run().interrupted == [lost]
    row = execution(runtime, lost)
    assert row.status == E.INTERRUPTED
    assert row.what_ran == {
        "calls": [
            {"seq": 1, "tool": "notes.list", "status": "succeeded"},
            {"seq": 2, "tool": "notes.write", "status": "in_doubt"},
        ],
        "in_doubt": [{"seq": 2, "tool": "notes.write"}],
    }
    assert call_statuses(runtime, lost) == {1: "succeeded", 2: "in_doubt"}


def test_a_call_already_in_doubt_keeps_its_execution_from_running_again(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    lost = orphan(
        runtime,
        [(1, "notes.write", "in_doubt", False), (2, "notes.list", "succeeded", True)],
    )
    assert runtime.recovery.run().interrupted == [lost]
    row = execution(runtime, lost)
    assert row.status == E.INTERRUPTED
    assert row.what_ran == {
        "calls": [
            {"seq": 1, "tool": "notes.write", "status": "in_doubt"},
            {"seq": 2, "tool": "notes.list", "status": "succeeded"},
        ],
        "in_doubt": [{"seq": 1, "tool": "notes.write"}],
    }


@pytest.mark.parametrize("status", ["requested", "approved"])
def test_conservative_recovery_withdraws_the_call_not_yet_sent(
    make_runtime: MakeRuntime, status: str
) -> None:
    """Nothing of the latest call was sent; the execution ends (the operator chose
    conservative recovery), so the call is withdrawn in the same step."""
    runtime = make_runtime(conservative_recovery=True)
    lost = orphan(
        runtime,
        [(1, "notes.list", "succeeded", True), (2, "notes.write", status, False)],
    )
    assert runtime.recovery.run().interrupted == [lost]
    assert execution(runtime, lost).status == E.INTERRUPTED
    assert call_statuses(runtime, lost) == {1: "succeeded", 2: "withdrawn"}


@pytest.mark.parametrize("status", ["requested", "approved"])
def test_a_call_not_yet_sent_waits_for_the_requeued_execution(
    make_runtime: MakeRuntime, status: str
) -> None:
    runtime = make_runtime()
    lost = orphan(runtime, [(1, "notes.write", status, False)])
    assert runtime.recovery.run().requeued == [lost]
    assert call_statuses(runtime, lost) == {1: status}


class RecoveredMeanwhile(Faults):
    """Another instance recovers the very orphan this one is about to commit for, from this
    one's first recovery write (its before-commit point)."""

    def __init__(self) -> None:
        super().__init__()
        self.other: Runtime | None = None
        self.taken: str | None = None

    def reached(self, point: CrashPoint) -> None:
        super().reached(point)
        other, self.other = self.other, None
        if other is not None and point.name == "execution:requeue:running->pending:before_commit":
            first = other.recovery.orphaned()[0]
            other.recovery.recover_execution(first)
            self.taken = first.id


def test_losing_the_race_for_one_orphan_does_not_stop_the_round(
    make_runtime: MakeRuntime,
) -> None:
    faults = RecoveredMeanwhile()
    here = make_runtime(faults=faults, instance_name="here")
    elsewhere = make_runtime(instance_name="elsewhere")
    orphans = {orphan(here), orphan(here)}
    faults.other = elsewhere
    report = here.recovery.run()
    assert faults.taken is not None
    assert report.requeued == sorted(orphans - {faults.taken})
    assert {execution(here, e).status for e in orphans} == {E.PENDING}


def test_a_round_that_recovers_work_says_so_in_the_log(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = make_runtime()

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "lockgate.recovery"]

    with caplog.at_level(logging.INFO, logger="lockgate.recovery"):
        runtime.recovery.run()
        assert logged() == []  # a round with nothing to do logs nothing
        lost = orphan(runtime)
        runtime.recovery.run()
    assert logged() == [f"recovered executions: requeued={[lost]!r} interrupted=[]"]


@dataclass
class TickingClock:
    """A clock that moves on by a second every time it is read."""

    now: datetime

    def __call__(self) -> datetime:
        read, self.now = self.now, self.now + timedelta(seconds=1)
        return read


def test_a_round_judges_every_lease_at_the_instant_it_began(make_runtime: MakeRuntime) -> None:
    """Declaring instances dead and taking over their work read the same instant: work is
    never taken from an instance the round did not declare dead, and an instance declared
    dead has its work taken over in that same round."""
    clock = FakeClock()
    dying = make_runtime(clock=clock, instance_name="dying", lease_ttl="10")
    survivor = make_runtime(clock=clock, instance_name="survivor", lease_ttl="60")
    lost = orphan(survivor, owner=dying.lease.id)
    with survivor.engine.store.session() as s:
        lapses = s.get(Instance, dying.lease.id)
    assert lapses is not None
    ticking = TickingClock(lapses.lease_until - timedelta(seconds=0.5))
    survivor.engine.clock = survivor.lease.clock = survivor.recovery.clock = ticking

    first = survivor.recovery.run()  # begins half a second before the lease lapses
    assert (first.declared_dead, first.requeued) == ([], [])
    assert execution(survivor, lost).status == E.RUNNING

    second = survivor.recovery.run()  # begins after it lapsed
    assert (second.declared_dead, second.requeued) == ([dying.lease.id], [lost])


class OwnerWakesMeanwhile(Faults):
    """The stalled owner wakes between recovery's read of the journal and its commit, and
    sends the call it was about to send (as the engine does: fenced on its execution, which
    recovery has not moved yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.wake: Callable[[], None] | None = None

    def reached(self, point: CrashPoint) -> None:
        super().reached(point)
        wake, self.wake = self.wake, None
        if wake is not None and point.name == "execution:requeue:running->pending:before_commit":
            wake()


def test_a_call_sent_after_recovery_read_the_journal_is_not_requeued_over(
    make_runtime: MakeRuntime,
) -> None:
    """Found under load by the real-process stall scenario: recovery decided `requeue` on a
    call it read as approved, the woken owner dispatched it, and the requeue committed
    anyway; the next owner found a dispatched call and failed the execution internally."""
    faults = OwnerWakesMeanwhile()
    runtime = make_runtime(faults=faults)
    lost = orphan(runtime, [(1, "notes.write", "approved", False)])
    with runtime.engine.store.session() as s:
        call = s.get(ToolCall, f"{lost}:1")
    assert call is not None
    running = record_of(execution(runtime, lost))

    def owner_sends_it() -> None:
        step = Step(record_of(call), "dispatch")
        runtime.engine.write.apply(step, effect=lambda: None, fence=running)

    faults.wake = owner_sends_it
    assert runtime.recovery.run().requeued == []  # decided on a stale journal: refused
    assert call_statuses(runtime, lost) == {1: "dispatched"}
    again = runtime.recovery.run()  # decides on what is stored now
    assert again.interrupted == [lost]
    assert call_statuses(runtime, lost) == {1: "in_doubt"}
