"""The durable engine, in process, on SQLite and PostgreSQL (every test runs on both)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from pydantic import JsonValue
from sqlmodel import select

from lockgate.machine.db.schema import Execution, ToolCall, TransitionLog
from lockgate.machine.engine import Action
from lockgate.machine.errors import Conflict
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    ExecutionNotFound,
    InvalidExecutionInput,
)
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox import RuntimeMismatch, seal, unseal
from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolSpec
from lockgate.simulation.world import SimClock
from lockgate.spec import CrashPoint, ExecutionStatus, ToolCallStatus
from tests.support.canary import CANARY

MakeRuntime = Callable[..., Runtime]

WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'


#: Simulated time that moves only when a test says so (the simulator's own clock).
Clock = SimClock


def notes_of(runtime: Runtime) -> NotesSource:
    source = runtime.sources[0]
    assert isinstance(source, NotesSource)
    return source


def writes(runtime: Runtime) -> list[dict[str, JsonValue]]:
    return [e for e in notes_of(runtime).effects() if not e["read"]]


def calls_of(runtime: Runtime, execution_id: str) -> list[ToolCall]:
    with runtime.engine.store.session() as s:
        return list(s.exec(select(ToolCall).where(ToolCall.execution_id == execution_id)))


def row_of(runtime: Runtime, execution_id: str) -> Execution:
    with runtime.engine.store.session() as s:
        row = s.get(Execution, execution_id)
    assert row is not None
    return row


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
    [call] = calls_of(rt, row.id)
    paused = phase == "after_commit"
    assert (row.status == ExecutionStatus.WAITING_FOR_INTERACTION) is paused
    assert (call.status == ToolCallStatus.AWAITING_APPROVAL) is paused
    if not paused:
        assert (row.status, call.status) == (ExecutionStatus.RUNNING, ToolCallStatus.REQUESTED)


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
    assert call.decision == {"action": str(action), "content": None}


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


# -- crashes and recovery (in process; real kills are in test_restart_processes) ------------


def restart(make_runtime: MakeRuntime, **settings: Any) -> Runtime:
    """A new incarnation on the same database: nothing is kept from the crashed one."""
    rt = make_runtime(**settings)
    rt.start(background=False)
    return rt


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


# -- secrets --------------------------------------------------------------------------------


class LeakySource:
    """A careless tool that returns and raises its secret: redaction must catch both."""

    name = "leaky"

    def tools(self) -> Sequence[Tool]:
        return [_Leaky("echo"), _Leaky("boom")]


class _Leaky:
    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            source="leaky",
            name=self.name,
            description="leaks its token",
            idempotent=True,
            default_policy=PolicyDecision.APPROVE,
            secrets=("notes_token",),
        )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        token = context.secrets["notes_token"]
        if self.name == "boom":
            raise ToolFailed(f"upstream rejected token {token}")
        return {"token": token, "note": f"auth={token}"}


def test_the_canary_secret_never_reaches_a_row_a_snapshot_or_a_log(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("DEBUG")
    notes = None
    rt = make_runtime()
    notes = rt.sources[0]
    rt2 = make_runtime(sources=[notes, LeakySource()])
    code = (
        "r = tools.leaky.echo()\nprint(r)\n"
        "try:\n    tools.leaky.boom()\nexcept Exception as e:\n    print(e)\n" + WRITE_THEN_READ
    )
    paused = rt2.engine.execute("alice", code)
    done = rt2.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED
    assert "[REDACTED]" in done.logs
    # And through a crash and recovery.
    point = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_effect")
    crashing = make_runtime(sources=[notes, LeakySource()], faults=Faults([point]))
    with pytest.raises(InjectedCrash):
        crashing.engine.execute("alice", "tools.leaky.echo()\n" + WRITE_THEN_READ)
    restart(make_runtime, sources=[notes, LeakySource()])
    dump = database_dump(rt2)
    assert "REDACTED" in dump  # the dump really holds the redacted results
    assert CANARY not in dump
    assert CANARY not in caplog.text
    out, err = capfd.readouterr()
    assert CANARY not in out and CANARY not in err


def database_dump(rt: Runtime) -> str:
    """Every row of every table, as text (bytes decoded loosely so snapshots are searched)."""
    from lockgate.machine.db.schema import metadata

    parts: list[str] = []
    with rt.engine.store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(table.select()):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        parts.append(bytes(value).decode("latin-1"))
                    else:
                        parts.append(repr(value))
    return "\n".join(parts)


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


def test_a_decision_for_an_earlier_call_never_decides_a_later_one(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    code = "tools.notes.write(key='a', text='1')\ntools.notes.write(key='b', text='2')\n'ok'"
    first = rt.engine.execute("alice", code)
    second = rt.engine.resume(first.id, "alice", Action.ACCEPT, expected_call=1)
    assert second.pending is not None and second.pending.seq == 2
    with pytest.raises(ExecutionAlreadySettled, match="earlier tool call"):
        rt.engine.resume(first.id, "alice", Action.ACCEPT, expected_call=1)
    assert rt.engine.view(first.id).status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert len(writes(rt)) == 1
