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
    # The first dispatch (the list) passes the point too: crash on the second, the write.
    first = make_runtime(faults=Faults([point], skip=1))
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
    point = CrashPoint.parse(f"tool_call:dispatch:approved->dispatched:{phase}")
    first = make_runtime(faults=Faults([point]))
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", "print('before the call')\nlen(tools.notes.list())")
    rt = restart(make_runtime)
    assert rt.boot_report is not None and len(rt.boot_report.requeued) == 1
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == 0
    reads = [e for e in notes_of(rt).effects() if e["tool"] == "notes.list"]
    assert len(reads) == dispatches  # at-least-once for idempotent tools, as stated
    # The same call carried on (its intent re-dispatched, under its own key), from the
    # checkpoint taken when it was requested: the code before it did not run again.
    assert {e["idempotency_key"] for e in reads} == {f"{execution_id}:1"}
    [call] = calls_of(rt, execution_id)
    assert (call.id, call.status, call.attempts) == (f"{execution_id}:1", "succeeded", 2)
    assert events_of(rt, call.id) == ["auto_approve", "dispatch", "redispatch", "succeed"]
    assert events_of(rt, execution_id) == [
        *["start", "checkpoint"],
        *["requeue", "start", "complete"],
    ]
    assert view.logs == "before the call\n"


def test_conservative_recovery_interrupts_even_idempotent_calls(
    make_runtime: MakeRuntime,
) -> None:
    point = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_commit")
    first = make_runtime(faults=Faults([point]))
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", "tools.notes.list()")
    rt = restart(make_runtime, conservative_recovery=True)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.interrupted
    assert rt.engine.view(execution_id).status is ExecutionStatus.INTERRUPTED
    assert notes_of(rt).effects() == []


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
    first = make_runtime(faults=Faults([point]))
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", TWO_CALLS)
    rt = restart(make_runtime)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == [[], []]
    # The line printed before the checkpoint was kept with it, and never printed again.
    assert view.logs == "before the first call\nbetween the calls\n"
    keys = [e["idempotency_key"] for e in notes_of(rt).effects()]
    assert keys == [f"{execution_id}:1", f"{execution_id}:2"]  # call 1 was not done again
    assert events_of(rt, f"{execution_id}:1") == ["auto_approve", "dispatch", "succeed"]
    assert events_of(rt, execution_id) == [
        *["start", "checkpoint"],  # the crashed run, up to call 1
        *["requeue", "start", "checkpoint", "complete"],  # recovery, on from call 1
    ]


def test_without_checkpoints_the_journal_is_replayed(make_runtime: MakeRuntime) -> None:
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(faults=Faults([point], skip=1), checkpoint_every_call=False)
    code = "a = tools.notes.list()\nb = tools.notes.list()\nprint(a, b)\n'ok'"
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", code)
    rt = restart(make_runtime, checkpoint_every_call=False)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == "ok"
    assert len(notes_of(rt).effects()) == 2  # both calls replayed from the journal


def test_a_replay_that_asks_for_another_tool_than_the_journal_fails_the_code(
    make_runtime: MakeRuntime,
) -> None:
    # The journal's call 1 is made to name another tool (as a journal written by other code
    # would): the replay must not hand notes.list the journal's result for notes.read.
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(faults=Faults([point], skip=1), checkpoint_every_call=False)
    code = "a = tools.notes.list()\nb = tools.notes.list()\n'ok'"
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", code)
    with Session(first.engine.store.engine) as session:
        [call] = session.exec(select(ToolCall).where(ToolCall.seq == 1)).all()
        call.tool = "notes.read"
        session.add(call)
        session.commit()
    rt = restart(make_runtime, checkpoint_every_call=False)
    assert rt.boot_report is not None
    [execution_id] = rt.boot_report.requeued
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.FAILED
    assert view.error is not None
    assert (
        "replaying after a restart, call 1 asked for tools.notes.list but the journal "
        "recorded tools.notes.read: the code is not deterministic"
    ) in str(view.error), view.error
    assert len(notes_of(rt).effects()) == 2  # nothing was called again


def test_recovery_is_idempotent_and_leaves_live_instances_alone(
    make_runtime: MakeRuntime,
) -> None:
    clock = Clock()
    point = CrashPoint.parse("tool_call:auto_approve:requested->approved:after_commit")
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
    code = 'tools.notes.list()\ntools.notes.write(key="k", text="v")'
    x = make_runtime(
        faults=Faults([dispatch]), clock=now, instance_name="x", policy="notes.write=approve"
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


#: A call that fails (no such note), caught by the code, then a call that succeeds.
FAIL_THEN_LIST = """
try:
    tools.notes.read(key="missing")
except Exception as e:
    caught = [type(e).__name__, str(e)]
tools.notes.list()
caught
"""


def test_a_failed_call_replayed_from_the_journal_raises_what_it_raised_live(
    make_runtime: MakeRuntime,
) -> None:
    """Replaying the journal after a crash answers a failed call with the same exception the
    code caught the first time: the code cannot tell a replay from the live run."""
    live = make_runtime(instance_name="live", checkpoint_every_call=False)
    expected = live.engine.execute("alice", FAIL_THEN_LIST)
    assert expected.status is ExecutionStatus.COMPLETED
    assert expected.result == [
        "RuntimeError",
        "tools.notes.read failed: there is no note 'missing'; tools.notes.list() shows the keys",
    ]

    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(faults=Faults([point]), checkpoint_every_call=False)
    with pytest.raises(InjectedCrash):
        first.engine.execute("bob", FAIL_THEN_LIST)
    rt = restart(make_runtime, checkpoint_every_call=False)
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
