"""The engine when two actors reach one execution at once, in process, on SQLite and
PostgreSQL, staged with gates at write-path points (never with timing): a cancel that loses
to a decision, two people deciding one call through the decision entry, a claim that loses
to another instance, and a stalled instance whose execution failed under it after another
instance took it over."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
from sqlalchemy.exc import OperationalError

from lockgate.machine.approval_audit import Door
from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionAlreadySettled
from lockgate.machine.faults import Faults
from lockgate.machine.faults import Gate as PointGate
from lockgate.machine.people import SignedIn
from lockgate.machine.runtime import Runtime
from lockgate.machine.views import ExecutionView
from lockgate.machine.write_path import Step
from lockgate.server.call_shown import call_shown
from lockgate.server.decisions import Decision, Decisions, Person
from lockgate.server.runner import ExecutionRunner
from lockgate.spec import CrashPoint, ExecutionStatus
from tests.support.engine_records import WRITE_THEN_READ, Clock, MakeRuntime, notes_of, row_of
from tests.support.engine_records import writes as writes_of
from tests.support.gate_tool import Gate, GateSource
from tests.support.threads import InThread

#: A read that waits for a person, and is then sent intent first, its result stored by a
#: commit of its own (one the policy approves is made at once, journaled with the end).
LIST_NEEDS_APPROVAL = "notes.list=require_approval"

CANCEL_GATE = "execution:cancel:waiting_for_interaction->cancelled:before_commit"
RESUME_ACCEPT_GATE = "tool_call:approve:awaiting_approval->approved:before_commit"


def _held_at(
    make_runtime: MakeRuntime, point: str, act: Callable[[Runtime, str], Any]
) -> tuple[Runtime, ExecutionView, InThread, PointGate]:
    """An execution paused for approval, and `act` on it in a thread of its own, held at
    `point` of the write path (before its commit) until the test opens the gate."""
    faults = Faults()
    rt = make_runtime(faults=faults)
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    gate = faults.gate(CrashPoint.parse(point))
    held = InThread(lambda: act(rt, paused.id), gate.give_up)
    assert gate.wait_until_held()
    return rt, paused, held, gate


def test_a_cancel_that_loses_to_a_cancel_decision_is_given_that_outcome(
    make_runtime: MakeRuntime,
) -> None:
    rt, paused, cancelling, gate = _held_at(
        make_runtime, CANCEL_GATE, lambda rt, e: rt.engine.cancel(e, "alice")
    )
    # Meanwhile the person cancels the call on the approval page: the code does not catch it.
    decided = rt.engine.resume(paused.id, "alice", Action.CANCEL)
    assert decided.status is ExecutionStatus.FAILED
    gate.open()
    # The same decision, already taken: the cancel is told what it led to, not refused.
    view: ExecutionView = cancelling.result()
    assert (view.id, view.status, view.error) == (decided.id, decided.status, decided.error)


def test_a_cancel_that_loses_to_an_approval_is_refused_naming_the_execution(
    make_runtime: MakeRuntime,
) -> None:
    rt, paused, cancelling, gate = _held_at(
        make_runtime, CANCEL_GATE, lambda rt, e: rt.engine.cancel(e, "alice")
    )
    assert rt.engine.resume(paused.id, "alice", Action.ACCEPT).status is ExecutionStatus.COMPLETED
    gate.open()
    with pytest.raises(ExecutionAlreadySettled) as info:
        cancelling.result()
    assert (info.value.execution_id, info.value.status) == (paused.id, "completed")
    assert "a decision was already recorded (accept)" in info.value.message


def test_cancelling_a_finished_execution_names_it_and_what_can_be_cancelled(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    done = rt.engine.execute("alice", "1")
    with pytest.raises(ExecutionAlreadySettled) as info:
        rt.engine.cancel(done.id, "alice")
    assert (info.value.execution_id, info.value.status) == (done.id, "completed")
    assert info.value.message == (
        f"Execution {done.id!r} is not waiting for a decision (only a pending or paused "
        "execution can be cancelled; it is completed now)."
    )


def test_run_claims_only_a_pending_execution_and_says_whether_it_did(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    assert rt.engine.run("no-such-execution") is False
    done = rt.engine.execute("alice", "1")
    assert rt.engine.run(done.id) is False
    assert row_of(rt, done.id).status == ExecutionStatus.COMPLETED
    queued = rt.engine.submit("alice", "2", session_id="s1")
    assert rt.engine.live_counts(session_id="s1") == {"running": 1, "paused": 0}
    assert rt.engine.run(queued) is True
    assert rt.engine.view(queued).result == 2


def test_a_draining_instance_claims_nothing(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    queued = rt.engine.submit("alice", "2")
    rt.engine.hand_back_all()
    assert rt.engine.run(queued) is False
    assert rt.engine.run_pending() == 0
    assert row_of(rt, queued).status == ExecutionStatus.PENDING


def test_a_claim_read_before_another_instance_took_it_loses_and_runs_nothing(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = make_runtime(), make_runtime()
    queued = a.engine.submit("alice", "tools.notes.list()\n'a'")
    stale: Execution = row_of(b, queued)  # b reads it pending...
    assert a.engine.run(queued) is True  # ...and a claims and runs it meanwhile
    monkeypatch.setattr(b.engine.store.executions, "get", lambda execution_id: stale)
    assert b.engine.run(queued) is False
    assert len(notes_of(b).effects()) == 1  # a's list, never b's


def test_a_stalled_instance_that_fails_after_its_work_was_taken_over_leaves_it_alone(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    b_faults = Faults()
    a = make_runtime(clock=clock, policy=LIST_NEEDS_APPROVAL)
    b = make_runtime(clock=clock, faults=b_faults, policy=LIST_NEEDS_APPROVAL)
    paused = a.engine.execute("alice", "tools.notes.list()\n'done'")
    # a stalls before storing an approved read's result, then its database fails it.
    stalled, release = threading.Event(), threading.Event()
    real = a.engine.write.apply

    def apply(*steps: Step, **options: Any) -> Any:
        if any(s.record.machine == "tool_call" and s.event == "succeed" for s in steps):
            stalled.set()
            assert release.wait(60)
            raise OperationalError("UPDATE tool_calls", {}, Exception("server closed"))
        return real(*steps, **options)

    monkeypatch.setattr(a.engine.write, "apply", apply)
    running = InThread(lambda: a.engine.resume(paused.id, "alice", Action.ACCEPT), stalled.set)
    assert stalled.wait(60)
    # a's lease lapses; b declares it dead, requeues the execution and claims it.
    clock.advance(a.settings.lease_ttl + timedelta(seconds=1))
    b.lease.heartbeat()
    [execution_id] = b.maintain().requeued
    claimed = b_faults.gate(CrashPoint.parse("execution:start:pending->running:after_commit"))
    b_runs = InThread(b.engine.run_pending, claimed.give_up)
    assert claimed.wait_until_held()
    release.set()  # a wakes up to its failure while b owns the execution
    running.result()
    row = row_of(b, execution_id)
    assert (row.status, row.owner) == (ExecutionStatus.RUNNING, b.lease.id)
    claimed.open()
    assert b_runs.result() == 1
    view = b.engine.view(execution_id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == "done"


def test_a_decision_that_loses_its_race_is_told_which_decision_won(
    make_runtime: MakeRuntime,
) -> None:
    rt, paused, accepting, gate = _held_at(
        make_runtime, RESUME_ACCEPT_GATE, lambda rt, e: rt.engine.resume(e, "alice", Action.ACCEPT)
    )
    declined = rt.engine.resume(paused.id, "alice", Action.DECLINE)
    gate.open()
    with pytest.raises(ExecutionAlreadySettled) as info:
        accepting.result()
    assert (info.value.execution_id, info.value.status) == (paused.id, declined.status)
    assert "a decision was already recorded (decline)" in info.value.message
    assert writes_of(rt) == []


@pytest.fixture
def runners() -> Iterator[list[ExecutionRunner]]:
    """The execution runners a test made, closed after it."""
    made: list[ExecutionRunner] = []
    yield made
    for runner in made:
        runner.close()


def _people_deciding(
    make_runtime: MakeRuntime, runners: list[ExecutionRunner]
) -> tuple[Runtime, ExecutionView, InThread, PointGate, Callable[[str, Action], ExecutionView]]:
    """An execution paused for approval and two approvers of alice, Ann and Bea, signed in;
    Ann's approval through the one decision entry (as the page sends it), in a thread of
    its own, held before its commit; and how a person decides there meanwhile."""
    faults = Faults()
    rt = make_runtime(faults=faults)
    runner = ExecutionRunner(rt)
    runners.append(runner)
    paused = rt.engine.execute("alice", WRITE_THEN_READ)
    shown = call_shown(rt.engine.store, paused.id, 1)
    assert shown is not None and shown.waiting
    decisions = Decisions(runner, rt.people, lambda view: None)

    def person(name: str) -> SignedIn:
        issued = rt.people.open_session(rt.people.add(name, principals=["alice"]), "passkey")
        signed_in = rt.people.signed_in(issued.token)
        assert signed_in is not None
        return signed_in

    people = {name: person(name) for name in ("Ann", "Bea")}

    def decide(name: str, action: Action) -> ExecutionView:
        who = Person(people[name], Door.APPROVAL_PAGE)
        decision = Decision(paused.id, action, call=1, shown=shown.digest)
        outcome = anyio.run(decisions.decide, who, decision)
        assert isinstance(outcome, ExecutionView), outcome
        return outcome

    gate = faults.gate(CrashPoint.parse(RESUME_ACCEPT_GATE))
    held = InThread(lambda: decide("Ann", Action.ACCEPT), gate.give_up)
    assert gate.wait_until_held()
    return rt, paused, held, gate, decide


def _decided_by(rt: Runtime, execution_id: str) -> tuple[str, str]:
    """(the action, the person's name) of the call's stored decision."""
    call = rt.engine.store.tool_calls.last_decided(execution_id)
    assert call is not None and isinstance(call.decision, dict), call
    person = call.decision["person"]
    assert isinstance(person, dict)
    return str(call.decision["action"]), str(person["name"])


def test_two_people_deciding_one_call_at_once_decide_it_once(
    make_runtime: MakeRuntime, runners: list[ExecutionRunner]
) -> None:
    """Ann approves on the page; her decision is held just before it commits while Bea
    declines the same call in the inbox. Bea's decision stands, alone; Ann is told the call
    was already settled, and by which decision, not shown Bea's outcome as her own."""
    rt, paused, ann, gate, decide = _people_deciding(make_runtime, runners)
    declined = decide("Bea", Action.DECLINE)
    assert declined.status is ExecutionStatus.FAILED
    gate.open()
    with pytest.raises(ExecutionAlreadySettled) as info:
        ann.result()
    assert (info.value.execution_id, info.value.status) == (paused.id, declined.status)
    assert "a decision was already recorded (decline)" in info.value.message
    assert _decided_by(rt, paused.id) == ("decline", "Bea")
    assert writes_of(rt) == []


def test_a_person_whose_approval_lost_to_another_s_is_told_it_was_settled(
    make_runtime: MakeRuntime, runners: list[ExecutionRunner]
) -> None:
    """Ann and Bea both approve at once; Bea's commits first. The write is made once and
    the audit names Bea; Ann decided nothing and is told so, rather than shown Bea's
    outcome as her own approval."""
    rt, paused, ann, gate, decide = _people_deciding(make_runtime, runners)
    assert decide("Bea", Action.ACCEPT).status is ExecutionStatus.COMPLETED
    gate.open()
    try:
        told = ann.result()
    except ExecutionAlreadySettled as settled:
        assert "a decision was already recorded (accept)" in settled.message
    else:
        raise AssertionError(f"Ann was answered as if she had decided: {told.status}")
    finally:
        assert _decided_by(rt, paused.id) == ("accept", "Bea")
        assert len(writes_of(rt)) == 1


def test_waiting_for_idle_waits_for_the_drive_under_way(make_runtime: MakeRuntime) -> None:
    held = Gate()
    rt = make_runtime(sources=[GateSource(held)])
    running = InThread(lambda: rt.engine.execute("alice", "tools.gate.hold()"), held.entered.set)
    assert held.entered.wait(60)
    waiting = InThread(lambda: rt.engine.wait_idle(60))
    # Within a bound too short for it, the answer is that something still runs, also
    # after another drive began and ended meanwhile.
    assert rt.engine.wait_idle(0.01) is False
    assert rt.engine.execute("bob", "1").result == 1
    assert rt.engine.wait_idle(0.01) is False
    held.opened.set()
    assert waiting.result() is True
    assert running.result().result == "opened"
    assert rt.engine.wait_idle(0) is True


def test_two_sweeps_expiring_one_pause_expire_it_once(make_runtime: MakeRuntime) -> None:
    clock = Clock()
    faults = Faults()
    a = make_runtime(clock=clock, faults=faults)
    b = make_runtime(clock=clock)
    paused = a.engine.execute("alice", WRITE_THEN_READ)
    clock.advance(a.settings.approval_ttl)
    gate = faults.gate(
        CrashPoint.parse("tool_call:expire:awaiting_approval->expired:before_commit")
    )
    sweeping = InThread(a.engine.expire_due, gate.give_up)
    assert gate.wait_until_held()
    assert b.engine.expire_due() == 1
    gate.open()
    # a's write lost to b's: a finds it expired (and counts it), and raises nothing.
    assert sweeping.result() == 1
    assert row_of(a, paused.id).status == ExecutionStatus.EXPIRED


@pytest.mark.parametrize(
    ("fails_at", "losing_write"), [("dispatch", "fail"), ("succeed", "requeue")]
)
def test_a_failure_whose_own_ending_loses_to_recovery_leaves_recovery_s_verdict(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch, fails_at: str, losing_write: str
) -> None:
    """The database fails a's call (before it is sent, or before its result is stored); as
    a ends the execution, b, which declared a dead meanwhile, has already recovered it: a's
    ending conflicts and is dropped, and b's verdict stands."""
    clock = Clock()
    a = make_runtime(clock=clock, policy=LIST_NEEDS_APPROVAL)
    b = make_runtime(clock=clock, policy=LIST_NEEDS_APPROVAL)
    paused = a.engine.execute("alice", "len(tools.notes.list())")
    real = a.engine.write.apply
    taken_over: list[str] = []

    def apply(*steps: Step, **options: Any) -> Any:
        events = {s.event for s in steps}
        if fails_at in events:
            raise OperationalError("UPDATE tool_calls", {}, Exception("server closed"))
        if losing_write in events and not taken_over:
            clock.advance(a.settings.lease_ttl + timedelta(seconds=1))
            b.lease.heartbeat()
            taken_over.extend(b.maintain().requeued)
        return real(*steps, **options)

    monkeypatch.setattr(a.engine.write, "apply", apply)
    first = a.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert taken_over == [first.id]
    assert first.status is ExecutionStatus.PENDING  # b's requeue, not a's ending
    assert b.engine.run_pending() == 1
    view = b.engine.view(first.id)
    assert view.status is ExecutionStatus.COMPLETED and view.result == 0


def test_one_round_of_pending_work_claims_at_most_fifty(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    queued = [rt.engine.submit("alice", "1") for _ in range(51)]
    assert rt.engine.run_pending() == 50
    assert rt.engine.run_pending(limit=5) == 1
    assert {rt.engine.view(execution_id).status for execution_id in queued} == {
        ExecutionStatus.COMPLETED
    }


def test_a_stalled_owner_whose_write_is_refused_leaves_the_execution_and_says_so(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    a_faults = Faults()
    a = make_runtime(clock=clock, faults=a_faults, policy=LIST_NEEDS_APPROVAL)
    b = make_runtime(clock=clock, policy=LIST_NEEDS_APPROVAL)
    paused = a.engine.execute("alice", "len(tools.notes.list())")
    gate = a_faults.gate(CrashPoint.parse("tool_call:succeed:dispatched->succeeded:before_commit"))
    running = InThread(lambda: a.engine.resume(paused.id, "alice", Action.ACCEPT), gate.give_up)
    assert gate.wait_until_held()
    clock.advance(a.settings.lease_ttl + timedelta(seconds=1))
    b.lease.heartbeat()
    [execution_id] = b.maintain().requeued
    with caplog.at_level(logging.WARNING, logger="lockgate.engine"):
        gate.open()
        assert running.result().status is ExecutionStatus.PENDING  # b's requeue stands
    assert f"execution {execution_id} changed under us; leaving it" in caplog.messages
    assert b.engine.run_pending() == 1
    assert b.engine.view(execution_id).result == 0


def test_each_principal_s_counts_are_its_own(make_runtime: MakeRuntime) -> None:
    """The admission limits count per principal: another principal's work never counts
    against one (uneven numbers, so a count of the others would show)."""
    rt = make_runtime()
    rt.engine.execute("alice", WRITE_THEN_READ)
    rt.engine.submit("alice", "1")
    for _ in range(3):
        rt.engine.execute("bob", WRITE_THEN_READ)
    assert rt.engine.paused_count("alice") == 1
    assert rt.engine.paused_count("bob") == 3
    assert rt.engine.live_counts(principal_id="alice") == {"running": 1, "paused": 1}
    assert rt.engine.live_counts(principal_id="bob") == {"running": 0, "paused": 3}
