"""What a client is told when an execution cannot go on, in process, on SQLite and PostgreSQL:
a decision that arrives too late or too often names the execution (and the deadline it
missed), and an execution whose stored checkpoint cannot be run again fails with a reason a
client can act on, never an internal error for a damaged or foreign snapshot."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    InvalidExecutionInput,
)
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox import MONTY_VERSION, RuntimeMismatch, seal, unseal
from lockgate.machine.write_path import Step
from lockgate.spec import CrashPoint, ExecutionStatus, ToolCallStatus
from tests.support.engine_records import (
    WRITE_THEN_READ,
    Clock,
    MakeRuntime,
    calls_of,
    notes_of,
    row_of,
    writes,
)

# -- a decision that cannot apply -----------------------------------------------------------


def test_a_decision_after_the_deadline_names_the_execution_and_its_deadline(
    make_runtime: MakeRuntime,
) -> None:
    clock = Clock()
    rt = make_runtime(clock=clock)
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    deadline = row_of(rt, paused.id).deadline
    assert deadline is not None
    clock.advance(rt.settings.approval_ttl)
    with pytest.raises(ExecutionExpired) as late:
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert late.value.execution_id == paused.id
    assert late.value.deadline == deadline.isoformat()
    assert f"Execution {paused.id!r} expired at {deadline.isoformat()}:" in late.value.message
    # Cancelling it afterwards is told the same.
    with pytest.raises(ExecutionExpired) as cancel:
        rt.engine.cancel(paused.id, "alice")
    assert (cancel.value.execution_id, cancel.value.deadline) == (paused.id, deadline.isoformat())


def test_a_decision_on_a_finished_execution_names_it_and_says_it_is_not_paused(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    done = rt.engine.execute("alice", "1")
    with pytest.raises(ExecutionAlreadySettled) as info:
        rt.engine.resume(done.id, "alice", Action.DECLINE)
    assert info.value.execution_id == done.id and info.value.status == "completed"
    assert info.value.message == (
        f"Execution {done.id!r} is not waiting for a decision (it is not paused; it is "
        "completed now)."
    )


def test_a_decision_on_an_interrupted_execution_names_it(make_runtime: MakeRuntime) -> None:
    point = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_effect")
    first = make_runtime(faults=Faults([point]))
    paused = first.engine.execute("alice", WRITE_THEN_READ)
    with pytest.raises(InjectedCrash):
        first.engine.resume(paused.id, "alice", Action.ACCEPT)
    rt = make_runtime()
    rt.maintain()
    with pytest.raises(ExecutionInterrupted) as info:
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert info.value.execution_id == paused.id
    assert info.value.message.startswith(f"Execution {paused.id!r} was interrupted")


# -- a checkpoint that cannot be run again ---------------------------------------------------

TWO_WRITES = "tools.notes.write(key='a', text='1')\ntools.notes.write(key='b', text='2')\n'done'"
WRITES_APPROVED = "notes.write=approve"


def _requeued_after_a_checkpoint(make_runtime: MakeRuntime) -> tuple[Runtime, str]:
    """An execution that died once its first write's result was stored, recovered (back in
    the queue, to go on from the checkpoint taken at that call) but not yet run again."""
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(faults=Faults([point]), policy=WRITES_APPROVED)
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", TWO_WRITES)
    rt = make_runtime(policy=WRITES_APPROVED)
    report = rt.maintain()
    [execution_id] = report.requeued
    row = row_of(rt, execution_id)
    assert row.status == ExecutionStatus.PENDING and row.snapshot is not None
    assert row.snapshot_call == 1
    return rt, execution_id


def _store_snapshot(rt: Runtime, execution_id: str, snapshot: bytes) -> None:
    with rt.engine.store.session() as s:
        stored = s.get(Execution, execution_id)
        assert stored is not None
        stored.snapshot = snapshot
        s.add(stored)
        s.commit()


def _failure_of(rt: Runtime, execution_id: str) -> object:
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.FAILED, view
    return view.error


def test_a_requeued_execution_goes_on_from_its_checkpoint(make_runtime: MakeRuntime) -> None:
    rt, execution_id = _requeued_after_a_checkpoint(make_runtime)
    assert rt.engine.run_pending() == 1
    view = rt.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == "done"


def test_a_damaged_checkpoint_fails_its_execution_as_damaged(make_runtime: MakeRuntime) -> None:
    rt, execution_id = _requeued_after_a_checkpoint(make_runtime)
    snapshot = row_of(rt, execution_id).snapshot
    assert snapshot is not None
    _store_snapshot(rt, execution_id, snapshot[:-1] + bytes([snapshot[-1] ^ 1]))
    assert rt.engine.run_pending() == 1
    assert _failure_of(rt, execution_id) == {
        "code": "snapshot_corrupt",
        "message": "the stored snapshot of this paused execution is damaged (its checksum "
        "does not match); it cannot be resumed",
    }


def test_a_checkpoint_of_another_runtime_version_fails_its_execution_naming_both(
    make_runtime: MakeRuntime,
) -> None:
    rt, execution_id = _requeued_after_a_checkpoint(make_runtime)
    snapshot = row_of(rt, execution_id).snapshot
    assert snapshot is not None
    dump, calls = unseal(snapshot)
    _store_snapshot(rt, execution_id, seal(dump, calls, version="0.9.0"))
    assert rt.engine.run_pending() == 1
    error = _failure_of(rt, execution_id)
    assert isinstance(error, dict) and error["code"] == "runtime_mismatch"
    assert error["message"] == RuntimeMismatch(sealed_version="0.9.0").message
    assert f"Monty {MONTY_VERSION}" in error["message"]


def test_an_unexpected_failure_fails_only_its_execution_with_a_next_step(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    first = make_runtime(faults=Faults([point]), policy=WRITES_APPROVED)
    with pytest.raises(InjectedCrash):
        first.engine.execute("alice", "tools.notes.write(key='a', text='1')\n'done'")
    rt = make_runtime(policy=WRITES_APPROVED)
    [execution_id] = rt.maintain().requeued
    # Its checkpoint names a call the journal does not hold: a store the engine cannot
    # trust. The execution fails (its call is settled); the engine goes on with others.
    with rt.engine.store.session() as s:
        stored = s.get(Execution, execution_id)
        assert stored is not None
        stored.snapshot_call = 7
        s.add(stored)
        s.commit()
    with caplog.at_level(logging.ERROR, logger="lockgate.engine"):
        assert rt.engine.run_pending() == 1
    assert _failure_of(rt, execution_id) == {
        "code": "internal_error",
        "message": "The server failed while running this execution; it was stopped. Run "
        "the code again.",
    }
    assert f"execution {execution_id} failed unexpectedly" in caplog.messages
    assert f"execution {execution_id}: checkpoint names a missing call 7" in caplog.text
    assert rt.engine.execute("alice", "2").result == 2


# -- the database fails under a call ---------------------------------------------------------
# A store error is what an engine cannot plan for: it fails the one execution, and the spec
# says how (an execution ends only once its call is settled), whatever state the call is in.


def _store_fails_once_at(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, event: str, *, passes: int = 0
) -> None:
    """The database refuses a commit of a tool call's `event`, once, after letting `passes`
    of them through (the disk, the network or a lock timeout; the write path's own code is
    not involved)."""
    real = rt.engine.write.apply
    seen: list[str] = []

    def apply(*steps: Step, **options: Any) -> Any:
        if any(s.record.machine == "tool_call" and s.event == event for s in steps):
            seen.append(event)
            if len(seen) == passes + 1:
                raise OperationalError("UPDATE tool_calls", {}, Exception("disk I/O error"))
        return real(*steps, **options)

    monkeypatch.setattr(rt.engine.write, "apply", apply)


def test_a_call_never_sent_is_withdrawn_when_its_execution_fails(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    _store_fails_once_at(rt, monkeypatch, "dispatch")
    view = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert view.status is ExecutionStatus.FAILED
    assert isinstance(view.error, dict) and view.error["code"] == "internal_error"
    [call] = calls_of(rt, view.id)
    assert call.status == ToolCallStatus.WITHDRAWN
    assert notes_of(rt).effects() == []


def test_a_new_call_whose_first_commit_fails_leaves_no_row(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new call's row commits with its checkpoint, approval and intent: when that commit
    fails, none of it is stored, and the execution fails with nothing sent."""
    rt = make_runtime(policy=WRITES_APPROVED)
    _store_fails_once_at(rt, monkeypatch, "dispatch")
    view = rt.engine.execute("alice", "tools.notes.write(key='a', text='1')")
    assert view.status is ExecutionStatus.FAILED
    assert isinstance(view.error, dict) and view.error["code"] == "internal_error"
    assert calls_of(rt, view.id) == []
    assert notes_of(rt).effects() == []


def test_the_call_withdrawn_is_the_latest_one(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime()
    two = "tools.notes.write(key='a', text='1')\ntools.notes.write(key='b', text='2')"
    paused = rt.engine.execute("alice", two)
    _store_fails_once_at(rt, monkeypatch, "dispatch", passes=1)
    second = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    view = rt.engine.resume(second.id, "alice", Action.ACCEPT)
    assert view.status is ExecutionStatus.FAILED
    assert [(c.seq, c.status) for c in sorted(calls_of(rt, view.id), key=lambda c: c.seq)] == [
        (1, ToolCallStatus.SUCCEEDED),
        (2, ToolCallStatus.WITHDRAWN),
    ]


def test_a_write_whose_result_was_not_stored_ends_interrupted_naming_it(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    _store_fails_once_at(rt, monkeypatch, "succeed")
    view = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    # The write was made, but its result never reached the journal: it is in doubt, and
    # the record says so instead of telling the client to run the code (and the write) again.
    assert view.status is ExecutionStatus.INTERRUPTED
    assert view.what_ran == {
        "calls": [{"seq": 1, "tool": "notes.write", "status": "in_doubt"}],
        "in_doubt": [{"seq": 1, "tool": "notes.write"}],
    }
    assert len(writes(rt)) == 1


def test_a_read_whose_result_was_not_stored_is_read_again_from_the_checkpoint(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read that needed approval is sent intent first, so its result has a commit of its
    # own (one the policy approves is made at once and journaled with the end).
    rt = make_runtime(policy="notes.list=require_approval")
    paused = rt.engine.execute("alice", "len(tools.notes.list())")
    _store_fails_once_at(rt, monkeypatch, "succeed")
    first = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert first.status is ExecutionStatus.PENDING  # back in the queue, as after a crash
    assert rt.engine.run_pending() == 1
    view = rt.engine.view(first.id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == 0
    assert [e["tool"] for e in notes_of(rt).effects()] == ["notes.list", "notes.list"]


def test_a_failed_execution_keeps_what_its_code_printed(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    view = rt.engine.execute("alice", "print('before the error')\nraise ValueError('no')")
    assert view.status is ExecutionStatus.FAILED
    assert view.logs == "before the error\n"


def test_code_is_refused_when_empty_or_past_its_limit_and_accepted_at_it(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(max_code_chars=10)
    with pytest.raises(InvalidExecutionInput) as empty:
        rt.engine.execute("alice", "  \n ")
    assert empty.value.message == "The code is empty: send the Python code to run."
    assert rt.engine.execute("alice", "1 + 2     ").result == 3  # exactly 10 characters
    with pytest.raises(InvalidExecutionInput) as long:
        rt.engine.execute("alice", "1 + 2      ")
    assert long.value.message == (
        "The code is 11 characters long; the limit is 10. Send a shorter program."
    )


def test_a_repeated_decision_is_compared_with_its_own_execution_s_latest_decision(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    # bob's execution holds the highest call number of all (3), declined and caught.
    bob = rt.engine.execute(
        "bob",
        "tools.notes.write(key='x', text='-')\n"
        "tools.notes.write(key='y', text='-')\n"
        "try:\n    tools.notes.write(key='z', text='-')\nexcept PermissionError:\n    pass\n"
        "'b'",
    )
    for action in (Action.ACCEPT, Action.ACCEPT, Action.DECLINE):
        bob = rt.engine.resume(bob.id, "bob", action)
    assert bob.status is ExecutionStatus.COMPLETED and bob.result == "b"
    # alice's first call declined (and caught), her second accepted.
    alice = rt.engine.execute(
        "alice",
        "try:\n    tools.notes.write(key='a', text='1')\nexcept PermissionError:\n    pass\n"
        "tools.notes.write(key='b', text='2')\n"
        "'a'",
    )
    alice = rt.engine.resume(alice.id, "alice", Action.DECLINE)
    alice = rt.engine.resume(alice.id, "alice", Action.ACCEPT)
    assert alice.status is ExecutionStatus.COMPLETED and alice.result == "a"
    # Her last decision, accept, repeated: the same outcome; the other one: refused.
    assert rt.engine.resume(alice.id, "alice", Action.ACCEPT).result == "a"
    with pytest.raises(ExecutionAlreadySettled, match=r"already recorded \(accept\)"):
        rt.engine.resume(alice.id, "alice", Action.DECLINE)
