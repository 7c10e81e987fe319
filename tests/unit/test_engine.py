"""The durable engine, in process, on SQLite and PostgreSQL (every test runs on both): running
code, pausing for approval and the decisions that resume it (repeated, raced, refused),
expiry, snapshots of another runtime version, cancelling, and the counts of live work.

Crashes and recovery are in test_engine_recovery, the canary secret in test_engine_secrets.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from pydantic import JsonValue
from sqlmodel import select

from lockgate.machine.db.schema import Execution, TransitionLog
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionNotFound,
    InvalidExecutionInput,
)
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.sandbox import RuntimeMismatch, seal, unseal
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolSpec
from lockgate.spec import CrashPoint, ExecutionStatus, ToolCallStatus
from tests.support.engine_records import (
    WRITE_THEN_READ,
    Clock,
    MakeRuntime,
    calls_of,
    row_of,
    writes,
)

# -- running code --------------------------------------------------------------------------


def test_code_runs_to_a_result_with_its_logs(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    view = rt.engine.execute(
        "alice", 'print("listing")\nkeys = tools.notes.list()\n{"n": len(keys)}'
    )
    assert view.status is ExecutionStatus.COMPLETED
    assert view.result == {"n": 0}
    assert view.logs == "listing\n"
    assert [c.status for c in view.calls] == [ToolCallStatus.SUCCEEDED]


def test_an_error_in_the_code_fails_the_execution_with_a_readable_reason(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    view = rt.engine.execute("alice", "x = 1\nraise ValueError('bad input')")
    assert view.status is ExecutionStatus.FAILED
    assert isinstance(view.error, dict)
    assert view.error["code"] == "runtime_error"
    assert "ValueError: bad input" in str(view.error["message"])


def test_limits_end_the_execution_as_failed_not_the_server(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(max_duration_secs=0.3, max_recursion_depth=50)
    looping = rt.engine.execute("alice", "while True:\n    pass")
    assert looping.status is ExecutionStatus.FAILED
    assert isinstance(looping.error, dict) and looping.error["code"] == "time_limit"
    deep = rt.engine.execute("alice", "def f(n):\n    return f(n + 1)\nf(0)")
    assert isinstance(deep.error, dict) and deep.error["code"] == "recursion_limit"
    # The server goes on serving.
    assert rt.engine.execute("alice", "1 + 1").result == 2


def test_large_results_are_truncated_with_a_marker(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(max_result_bytes=1024)
    view = rt.engine.execute("alice", "'x' * 5000")
    assert isinstance(view.result, dict) and view.result["truncated"] is True
    assert view.result["original_bytes"] == 5002


def test_bad_code_input_is_refused_clearly(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(max_code_chars=100)
    with pytest.raises(InvalidExecutionInput, match="empty"):
        rt.engine.execute("alice", "   ")
    with pytest.raises(InvalidExecutionInput, match="limit is 100"):
        rt.engine.execute("alice", "x = 1\n" * 50)


def test_bad_tool_arguments_raise_inside_the_code(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    code = "try:\n    tools.notes.read(name='k')\nexcept TypeError as e:\n    r = str(e)\nr"
    view = rt.engine.execute("alice", code)
    assert view.status is ExecutionStatus.COMPLETED
    assert "notes.read" in str(view.result) and "key" in str(view.result)
    assert view.calls == []  # nothing that could run was journaled


# -- approvals ----------------------------------------------------------------------------


def test_a_call_needing_approval_pauses_with_everything_stored_at_once(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    view = rt.engine.execute("alice", WRITE_THEN_READ)
    assert view.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert view.pending is not None
    assert view.pending.tool == "notes.write"
    assert view.pending.message == (
        "Approve the call to tools.notes.write? Review the arguments before you accept."
    )
    assert view.pending.arguments_preview == {"key": "k", "text": "v"}
    assert view.pending.deadline is not None
    row = row_of(rt, view.id)
    assert row.snapshot is not None and row.runtime_version and row.owner is None
    [call] = calls_of(rt, view.id)
    assert call.status == ToolCallStatus.AWAITING_APPROVAL
    # The pause and the request for approval were one transaction: same instant in the log.
    with rt.engine.store.session() as s:
        log = list(
            s.exec(
                select(TransitionLog).where(
                    TransitionLog.event.in_(  # type: ignore[attr-defined]
                        ["pause", "request_approval"]
                    )
                )
            )
        )
    assert len(log) == 2 and log[0].at == log[1].at
    assert writes(rt) == []


@pytest.mark.parametrize(
    "phase", ["before_commit", "after_commit"], ids=["crash-before", "crash-after"]
)
def test_the_pause_is_atomic_under_a_crash(make_runtime: MakeRuntime, phase: str) -> None:
    point = CrashPoint.parse(f"execution:pause:running->waiting_for_interaction:{phase}")
    rt = make_runtime(faults=Faults([point]))
    with pytest.raises(InjectedCrash):
        rt.engine.execute("alice", WRITE_THEN_READ)
    with rt.engine.store.session() as s:
        row = s.exec(select(Execution)).one()
    calls = calls_of(rt, row.id)
    if phase == "after_commit":
        assert row.status == ExecutionStatus.WAITING_FOR_INTERACTION
        assert [c.status for c in calls] == [ToolCallStatus.AWAITING_APPROVAL]
    else:
        # The call's row commits with the pause (and the checkpoint): none of it is stored.
        assert (row.status, row.snapshot, calls) == (ExecutionStatus.RUNNING, None, [])


def test_accept_dispatches_the_call_and_the_code_goes_on(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.result == {"key": "k", "text": "v"}
    assert len(writes(rt)) == 1
    assert writes(rt)[0]["idempotency_key"] == f"{paused.id}:1"


@pytest.mark.parametrize(
    ("action", "verb"), [(Action.DECLINE, "declined"), (Action.CANCEL, "cancelled")]
)
def test_decline_and_cancel_raise_inside_the_code_which_may_catch_it(
    make_runtime: MakeRuntime, action: Action, verb: str
) -> None:
    rt = make_runtime()
    code = (
        "try:\n    tools.notes.delete(key='k')\n    said = 'deleted'\n"
        "except PermissionError as e:\n    said = str(e)\nsaid"
    )
    paused = rt.engine.execute("alice", code)
    done = rt.engine.resume(paused.id, "alice", action)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.result == f"the call to tools.notes.delete was {verb} by the approver"
    assert writes(rt) == []
    [call] = calls_of(rt, paused.id)
    assert call.status == ToolCallStatus.DECLINED
    assert isinstance(call.decision, dict)
    assert (call.decision["action"], call.decision["content"]) == (str(action), None)


def test_an_uncaught_decline_fails_the_execution(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    done = rt.engine.resume(paused.id, "alice", Action.DECLINE)
    assert done.status is ExecutionStatus.FAILED
    assert "PermissionError" in str(done.error)


def test_policy_rules_approve_or_block_without_asking(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(policy="notes.write=approve,notes.delete=block")
    view = rt.engine.execute("alice", WRITE_THEN_READ)
    assert view.status is ExecutionStatus.COMPLETED and view.result == {"key": "k", "text": "v"}
    code = "try:\n    tools.notes.delete(key='k')\nexcept PermissionError as e:\n    r = str(e)\nr"
    blocked = rt.engine.execute("alice", code)
    assert blocked.result == "tools.notes.delete is blocked by the server's policy"
    assert [c.status for c in blocked.calls] == [ToolCallStatus.BLOCKED]


def test_several_pauses_in_one_execution(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    code = (
        "tools.notes.write(key='a', text='1')\n"
        "tools.notes.write(key='b', text='2')\n"
        "sorted(tools.notes.list())"
    )
    first = rt.engine.execute("alice", code)
    second = rt.engine.resume(first.id, "alice", Action.ACCEPT)
    assert second.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert second.pending is not None and second.pending.seq == 2
    done = rt.engine.resume(first.id, "alice", Action.ACCEPT)
    assert done.result == ["a", "b"] and len(writes(rt)) == 2


# -- resume: idempotence, races, errors -----------------------------------------------------


def test_repeating_the_decision_returns_the_same_outcome(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    first = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    again = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert again.status == first.status and again.result == first.result
    with pytest.raises(ExecutionAlreadySettled, match=r"already recorded \(accept\)"):
        rt.engine.resume(paused.id, "alice", Action.DECLINE)
    assert len(writes(rt)) == 1


class GatedSource:
    """A tool source whose `gate.wait` blocks until the test opens the gate."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def tools(self) -> Sequence[Tool]:
        return [_GateTool(self)]


class _GateTool:
    def __init__(self, source: GatedSource) -> None:
        self.source = source

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            source="gate",
            name="wait",
            description="blocks until released",
            default_policy=PolicyDecision.REQUIRE_APPROVAL,
        )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        self.source.calls += 1
        self.source.entered.set()
        if not self.source.release.wait(30):
            raise ToolFailed("the test never opened the gate")
        return "opened"


def test_a_concurrent_second_resume_gets_already_settled(make_runtime: MakeRuntime) -> None:
    gate = GatedSource()
    rt = make_runtime(sources=[gate])
    paused = rt.engine.execute("alice", "tools.gate.wait()")
    outcome: dict[str, Any] = {}

    def first() -> None:
        outcome["first"] = rt.engine.resume(paused.id, "alice", Action.ACCEPT)

    worker = threading.Thread(target=first)
    worker.start()
    assert gate.entered.wait(30)  # the first resume is dispatching the call right now
    with pytest.raises(ExecutionAlreadySettled) as info:
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert info.value.status == "running"
    gate.release.set()
    worker.join(30)
    assert outcome["first"].status is ExecutionStatus.COMPLETED
    assert gate.calls == 1  # the pending call was dispatched once


def test_two_resumes_racing_for_the_decision_dispatch_once(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def resume() -> None:
        barrier.wait()
        try:
            results.append(rt.engine.resume(paused.id, "alice", Action.ACCEPT).status)
        except ExecutionAlreadySettled as exc:
            results.append(exc.code)

    threads = [threading.Thread(target=resume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    assert len(writes(rt)) == 1
    assert ExecutionStatus.COMPLETED in results


def test_resume_errors_name_the_case(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    with pytest.raises(ExecutionNotFound) as missing:
        rt.engine.resume("nope", "alice", Action.ACCEPT)
    assert missing.value.code == "not_found" and missing.value.hint
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    # Another principal's execution is answered exactly like a missing one.
    with pytest.raises(ExecutionNotFound) as foreign:
        rt.engine.resume(paused.id, "mallory", Action.ACCEPT)
    assert foreign.value.code == "not_found"
    assert foreign.value.message == ExecutionNotFound(execution_id=paused.id).message
    with pytest.raises(ExecutionNotFound):
        rt.engine.get(paused.id, "mallory")
    done = rt.engine.execute("alice", "1")
    with pytest.raises(ExecutionAlreadySettled, match="not paused"):
        rt.engine.resume(done.id, "alice", Action.ACCEPT)


def test_a_decision_for_an_earlier_call_never_decides_a_later_one(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    code = "tools.notes.write(key='a', text='1')\ntools.notes.write(key='b', text='2')\n'ok'"
    first = rt.engine.execute("alice", code)
    second = rt.engine.resume(first.id, "alice", Action.ACCEPT, expected_call=1)
    assert second.pending is not None and second.pending.seq == 2
    with pytest.raises(ExecutionAlreadySettled) as earlier:
        rt.engine.resume(first.id, "alice", Action.ACCEPT, expected_call=1)
    assert (earlier.value.execution_id, earlier.value.status) == (
        first.id,
        "waiting_for_interaction",
    )
    assert earlier.value.message == (
        f"Execution {first.id!r} is not waiting for a decision (the decision was for an "
        "earlier tool call; it is waiting_for_interaction now)."
    )
    assert rt.engine.view(first.id).status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert len(writes(rt)) == 1


# -- expiry ---------------------------------------------------------------------------------


def test_a_paused_execution_expires_lazily_on_access(make_runtime: MakeRuntime) -> None:
    clock = Clock()
    rt = make_runtime(clock=clock, approval_ttl=timedelta(hours=1))
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    clock.advance(timedelta(hours=1, seconds=1))
    with pytest.raises(ExecutionExpired) as info:
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert info.value.code == "expired" and "execute" in (info.value.hint or "")
    assert rt.engine.get(paused.id, "alice").status is ExecutionStatus.EXPIRED
    [call] = calls_of(rt, paused.id)
    assert call.status == ToolCallStatus.EXPIRED
    assert writes(rt) == []


def test_the_sweep_expires_overdue_pauses_only(make_runtime: MakeRuntime) -> None:
    clock = Clock()
    rt = make_runtime(clock=clock, approval_ttl=timedelta(minutes=10))
    early = rt.engine.execute("alice", WRITE_THEN_READ)
    clock.advance(timedelta(minutes=6))
    late = rt.engine.execute("alice", WRITE_THEN_READ)
    clock.advance(timedelta(minutes=5))
    assert rt.engine.expire_due() == 1
    assert rt.engine.view(early.id).status is ExecutionStatus.EXPIRED
    assert rt.engine.view(late.id).status is ExecutionStatus.WAITING_FOR_INTERACTION


# -- runtime version --------------------------------------------------------------------------


def test_a_snapshot_from_another_runtime_version_is_refused_clearly(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    row = row_of(rt, paused.id)
    assert row.snapshot is not None
    dump, calls = unseal(row.snapshot)
    with rt.engine.store.session() as s:
        stored = s.get(Execution, paused.id)
        assert stored is not None
        stored.snapshot = seal(dump, calls, version="0.9.0")
        s.add(stored)
        s.commit()
    with pytest.raises(RuntimeMismatch) as info:
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert info.value.code == "runtime_mismatch" and "0.9.0" in info.value.message
    # Nothing was consumed: the execution still waits for its decision.
    assert rt.engine.view(paused.id).status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert writes(rt) == []


# -- live work and cancelling ----------------------------------------------------------------


def test_counts_of_live_work_for_the_session_lease(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    rt.engine.execute("alice", WRITE_THEN_READ, session_id="s1")
    rt.engine.execute("alice", "1", session_id="s1")
    rt.engine.execute("bob", WRITE_THEN_READ, session_id="s2")
    assert rt.engine.live_counts(session_id="s1") == {"running": 0, "paused": 1}
    assert rt.engine.live_counts(principal_id="bob") == {"running": 0, "paused": 1}
    assert rt.engine.live_counts() == {"running": 0, "paused": 2}


def test_cancel_withdraws_the_pending_call(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    view = rt.engine.cancel(paused.id, "alice")
    assert view.status is ExecutionStatus.CANCELLED
    assert [c.status for c in view.calls] == [ToolCallStatus.WITHDRAWN]
    with pytest.raises(ExecutionAlreadySettled):
        rt.engine.resume(paused.id, "alice", Action.ACCEPT)
