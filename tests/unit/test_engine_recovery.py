"""The durable engine's crashes and recovery, in process, on SQLite and PostgreSQL (every test
runs on both; real kills are in test_restart_processes): a pause survives a restart, a call
cut off mid-dispatch is retried if idempotent and interrupted if not, recovery goes on from
the last checkpoint (or replays the journal), is idempotent, and leaves live instances alone.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session, select

from lockgate.machine.db.schema import ToolCall, TransitionLog
from lockgate.machine.engine import Action
from lockgate.machine.errors import Conflict
from lockgate.machine.execution_errors import ExecutionInterrupted
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.spec import CrashPoint, ExecutionStatus, ToolCallStatus
from tests.support.engine_records import (
    WRITE_THEN_READ,
    Clock,
    MakeRuntime,
    calls_of,
    notes_of,
    restart,
    row_of,
    writes,
)


def test_a_pause_survives_a_restart(make_runtime: MakeRuntime) -> None:
    paused = make_runtime().engine.execute("alice", WRITE_THEN_READ)
    rt = restart(make_runtime)
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED and done.result == {"key": "k", "text": "v"}


def test_crash_mid_dispatch_of_a_non_idempotent_call_ends_interrupted(
    make_runtime: MakeRuntime,
) -> None:
    point = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_effect")
    # The list before it is made at once (no dispatch): the crash is the write's.
    first = make_runtime(faults=Faults([point]))
    paused = first.engine.execute("alice", "tools.notes.list()\n" + WRITE_THEN_READ)
    with pytest.raises(InjectedCrash):
        first.engine.resume(paused.id, "alice", Action.ACCEPT)
    rt = restart(make_runtime)
    assert rt.boot_report is not None and rt.boot_report.interrupted == [paused.id]
    view = rt.engine.view(paused.id)
    assert view.status is ExecutionStatus.INTERRUPTED
    assert view.what_ran == {
        "calls": [
            {"seq": 1, "tool": "notes.list", "status": "succeeded"},
            {"seq": 2, "tool": "notes.write", "status": "in_doubt"},
        ],
        "in_doubt": [{"seq": 2, "tool": "notes.write"}],
    }
    with pytest.raises(ExecutionInterrupted) as info:
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert info.value.as_dict()["what_ran"] == view.what_ran
    assert len(writes(rt)) == 1  # it ran once, before the crash, and never again


@pytest.mark.parametrize(("phase", "dispatches"), [("after_commit", 1), ("after_effect", 2)])
def test_crash_mid_dispatch_of_an_idempotent_call_is_retried(
    make_runtime: MakeRuntime, phase: str, dispatches: int
) -> None:
    """A read that needed approval is sent intent first; cut off mid-dispatch, the requeued
    execution sends it again under the same key, from the checkpoint taken at the call."""
    point = CrashPoint.parse(f"tool_call:dispatch:approved->dispatched:{phase}")
    first = make_runtime(faults=Faults([point]), policy=LIST_NEEDS_APPROVAL)
    code = "print('before the call')\nlen(tools.notes.list())"
    paused = first.engine.execute("alice", code)
    with pytest.raises(InjectedCrash):
        first.engine.resume(paused.id, "alice", Action.ACCEPT)
    rt = restart(make_runtime, policy=LIST_NEEDS_APPROVAL)
    assert rt.boot_report is not None and rt.boot_report.requeued == [paused.id]
    view = rt.engine.view(paused.id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == 0
    reads = [e for e in notes_of(rt).effects() if e["tool"] == "notes.list"]
    assert len(reads) == dispatches  # at-least-once for idempotent tools, as stated
    # The same call carried on (its intent re-dispatched, under its own key), from the
    # checkpoint taken when it was requested: the code before it did not run again.
    assert {e["idempotency_key"] for e in reads} == {f"{paused.id}:1"}
    [call] = calls_of(rt, paused.id)
    assert (call.id, call.status, call.attempts) == (f"{paused.id}:1", "succeeded", 2)
    assert events_of(rt, call.id) == [
        *["request_approval", "approve", "dispatch"],
        *["redispatch", "succeed"],
    ]
    assert events_of(rt, paused.id) == [
        *["start", "checkpoint", "pause", "resume"],
        *["requeue", "start", "complete"],
    ]
    assert view.logs == "before the call\n"


def test_conservative_recovery_interrupts_even_idempotent_calls(
    make_runtime: MakeRuntime,
) -> None:
    """With retries off a read is journaled intent first too, and one cut off mid-dispatch
    ends its execution interrupted."""
    point = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_commit")
    first = make_runtime(faults=Faults([point]), conservative_recovery=True)
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", "tools.notes.list()")
    rt = restart(make_runtime, conservative_recovery=True)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.interrupted
    assert rt.engine.view(execution_id).status is ExecutionStatus.INTERRUPTED
    assert notes_of(rt).effects() == []


#: A policy that sends writes without asking (intent first: they must not run twice).
WRITES_APPROVED = "notes.write=approve"
#: A policy under which a read waits for a person, and is then sent intent first.
LIST_NEEDS_APPROVAL = "notes.list=require_approval"

#: Two writes, with a line printed before each: a print that runs again shows in the logs.
TWO_WRITES = (
    "print('before the first call')\n"
    "tools.notes.write(key='a', text='1')\n"
    "print('between the calls')\n"
    "tools.notes.write(key='b', text='2')\n"
    "'done'"
)

#: Two calls, with a line printed before each: a print that runs again shows in the logs.
TWO_CALLS = (
    "print('before the first call')\n"
    "a = tools.notes.list()\n"
    "print('between the calls')\n"
    "b = tools.notes.list()\n"
    "[a, b]"
)


def events_of(runtime: Runtime, record_id: str) -> list[str]:
    with runtime.engine.store.session() as s:
        rows = s.exec(select(TransitionLog).where(TransitionLog.record_id == record_id))
        return [row.event for row in sorted(rows, key=lambda row: row.id or 0)]


def test_crash_between_calls_goes_on_from_the_checkpoint(make_runtime: MakeRuntime) -> None:
    """Not a replay from scratch (which would give the same result and the same effects,
    answering call 1 from the journal): the code before the checkpoint does not run again,
    call 1 is not dispatched again, and the requeued execution starts at call 1."""
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(faults=Faults([point]), policy=WRITES_APPROVED)
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", TWO_WRITES)
    rt = restart(make_runtime, policy=WRITES_APPROVED)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == "done"
    # The line printed before the checkpoint was kept with it, and never printed again.
    assert view.logs == "before the first call\nbetween the calls\n"
    keys = [e["idempotency_key"] for e in notes_of(rt).effects()]
    assert keys == [f"{execution_id}:1", f"{execution_id}:2"]  # call 1 was not done again
    assert events_of(rt, f"{execution_id}:1") == ["auto_approve", "dispatch", "succeed"]
    assert events_of(rt, execution_id) == [
        *["start", "checkpoint"],  # the crashed run, up to call 1
        *["requeue", "start", "checkpoint", "complete"],  # recovery, on from call 1
    ]


def test_a_crash_before_reads_are_journaled_makes_them_again_from_the_last_checkpoint(
    make_runtime: MakeRuntime,
) -> None:
    """Reads the policy approves are made at once, their journal entries riding with the
    next durable commit (here the end): a crash before it goes on from the last durable
    checkpoint (the start) and makes them again, under the same keys; nothing of the lost
    run is stored, its printed lines included."""
    point = CrashPoint.parse("tool_call:succeed_at_least_once:requested->succeeded:after_effect")
    first = make_runtime(faults=Faults([point], skip=1))
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", TWO_CALLS)
    rt = restart(make_runtime)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == [[], []]
    assert view.logs == "before the first call\nbetween the calls\n"
    keys = [e["idempotency_key"] for e in notes_of(rt).effects()]
    assert keys == [f"{execution_id}:1", f"{execution_id}:2"] * 2
    for seq in (1, 2):
        assert events_of(rt, f"{execution_id}:{seq}") == ["succeed_at_least_once"]
    assert events_of(rt, execution_id) == ["start", "requeue", "start", "complete"]


def test_without_checkpoints_the_journal_is_replayed(make_runtime: MakeRuntime) -> None:
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(
        faults=Faults([point], skip=1), checkpoint_every_call=False, policy=WRITES_APPROVED
    )
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", TWO_WRITES)
    rt = restart(make_runtime, checkpoint_every_call=False, policy=WRITES_APPROVED)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == "done"
    assert len(notes_of(rt).effects()) == 2  # both calls replayed from the journal


def test_a_replay_that_asks_for_another_tool_than_the_journal_fails_the_code(
    make_runtime: MakeRuntime,
) -> None:
    # The journal's call 1 is made to name another tool (as a journal written by other code
    # would): the replay must not hand notes.write the journal's result for notes.read.
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(
        faults=Faults([point], skip=1), checkpoint_every_call=False, policy=WRITES_APPROVED
    )
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", TWO_WRITES)
    with Session(first.engine.store.engine) as session:
        [call] = session.exec(select(ToolCall).where(ToolCall.seq == 1)).all()
        call.tool = "notes.read"
        session.add(call)
        session.commit()
    rt = restart(make_runtime, checkpoint_every_call=False, policy=WRITES_APPROVED)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.FAILED
    assert view.error is not None
    assert (
        "replaying after a restart, call 1 asked for tools.notes.write but the journal "
        "recorded tools.notes.read: the code is not deterministic"
    ) in str(view.error), view.error
    assert len(notes_of(rt).effects()) == 2  # nothing was called again


def test_recovery_is_idempotent_and_leaves_live_instances_alone(
    make_runtime: MakeRuntime,
) -> None:
    clock = Clock()
    point = CrashPoint.parse("tool_call:succeed_at_least_once:requested->succeeded:after_effect")
    crashed = make_runtime(faults=Faults([point]), clock=clock, instance_name="a")
    with pytest.raises(InjectedCrash):
        crashed.engine.execute("alice", "tools.notes.list()")
    other = make_runtime(clock=clock, instance_name="b")
    first_round = other.maintain()
    assert first_round.requeued == []  # a's lease still holds: its work is untouched
    clock.advance(timedelta(seconds=16))
    assert other.maintain().requeued != []
    assert other.maintain().requeued == []  # a second round finds nothing to do
    assert other.engine.run_pending() == 1
    with other.engine.store.session() as s:
        requeues = list(s.exec(select(TransitionLog).where(TransitionLog.event == "requeue")))
    assert len(requeues) == 1


def test_a_stale_recovery_never_touches_a_live_instances_call(make_runtime: MakeRuntime) -> None:
    """C reads an orphan; B recovers it first and is mid-dispatch of a new write when C acts
    on its stale read: C's whole step conflicts and B's call is left alone."""
    now, later = Clock(), Clock()
    later.advance(timedelta(hours=1))  # x's lease has long lapsed for b and c
    dispatch = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_commit")
    # x dies with the list made but not yet journaled: its execution is requeued.
    read = CrashPoint.parse("tool_call:succeed_at_least_once:requested->succeeded:after_effect")
    code = 'tools.notes.list()\ntools.notes.write(key="k", text="v")'
    x = make_runtime(
        faults=Faults([read]), clock=now, instance_name="x", policy="notes.write=approve"
    )
    with pytest.raises(InjectedCrash):
        x.engine.execute("alice", code)
    b = make_runtime(
        faults=Faults([dispatch]), clock=later, instance_name="b", policy="notes.write=approve"
    )
    c = make_runtime(clock=later, instance_name="c", policy="notes.write=approve")
    [stale] = c.recovery.orphaned()
    assert b.recovery.run().requeued == [stale.id]
    with pytest.raises(InjectedCrash):
        b.engine.run(stale.id)  # b is now dispatching call 2, its lease alive
    with pytest.raises(Conflict):
        c.recovery.recover_execution(stale)
    [_, second] = sorted(calls_of(b, stale.id), key=lambda call: call.seq)
    assert second.status == ToolCallStatus.DISPATCHED
    assert row_of(b, stale.id).owner == b.lease.id


#: A read that fails (no such note), caught by the code, then a write that succeeds: the
#: read's journal entry commits with the write's intent.
FAIL_THEN_WRITE = """
try:
    tools.notes.read(key="missing")
except Exception as e:
    caught = [type(e).__name__, str(e)]
tools.notes.write(key="k", text="v")
caught
"""


def test_a_failed_call_replayed_from_the_journal_raises_what_it_raised_live(
    make_runtime: MakeRuntime,
) -> None:
    """Replaying the journal after a crash answers a failed call with the same exception the
    code caught the first time: the code cannot tell a replay from the live run."""
    live = make_runtime(instance_name="live", checkpoint_every_call=False, policy=WRITES_APPROVED)
    expected = live.engine.execute("alice", FAIL_THEN_WRITE)
    assert expected.status is ExecutionStatus.COMPLETED
    assert expected.result == [
        "RuntimeError",
        "tools.notes.read failed: there is no note 'missing'; tools.notes.list() shows the keys",
    ]

    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(
        faults=Faults([point]), checkpoint_every_call=False, policy=WRITES_APPROVED
    )
    with pytest.raises(InjectedCrash):
        first.engine.execute("bob", FAIL_THEN_WRITE)
    rt = restart(make_runtime, checkpoint_every_call=False, policy=WRITES_APPROVED)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    replayed = rt.engine.view(execution_id)
    assert replayed.status is ExecutionStatus.COMPLETED
    assert replayed.result == expected.result
    # Neither call was made again: both were answered from the journal.
    assert [c.status for c in calls_of(rt, execution_id)] == [
        ToolCallStatus.FAILED,
        ToolCallStatus.SUCCEEDED,
    ]
