"""The model checker proves the shipped specs and catches planted mistakes with a trace."""

from __future__ import annotations

import pytest

import lockgate.spec as spec
from lockgate.spec import (
    COMPOSITIONS,
    EXECUTION,
    MACHINES,
    OWED_REQUEST,
    TOOL_CALL,
    crash_points,
    load,
)
from lockgate.spec.model import Otherwise, TransitionKind, TransitionSpec, recover_by
from lockgate.spec.model_checker import check_all, check_composition, check_machine
from tests.support.spec_factories import with_states, with_transitions, without_transition


def test_the_shipped_lifecycles_hold_every_invariant() -> None:
    reports = check_all(MACHINES, COMPOSITIONS)
    assert [r.name for r in reports] == [*MACHINES, *COMPOSITIONS]
    for report in reports:
        assert report.ok, report.render()
        assert report.states > 1 and report.transitions > report.states
    by_name = {r.name: r for r in reports}
    for name, machine in MACHINES.items():
        # Every crash point the spec declares is visited by the exploration.
        assert by_name[name].crash_points_reached == {p.name for p in crash_points(machine)}
    product = by_name["execution_with_tool_call"]
    assert product.crash_points_reached == {
        p.name for m in (EXECUTION, TOOL_CALL) for p in crash_points(m)
    }


def test_a_state_without_recovery_edge_is_found_stranded_with_its_trace() -> None:
    planted = with_states(EXECUTION, running={"on_crash": None})
    report = check_machine(planted)
    stranded = next(v for v in report.violations if v.invariant.startswith("no state"))
    assert "'running' has no live owner" in stranded.detail
    assert stranded.trace == (
        "execution.start, crash at execution:start:pending->running:after_commit, restart",
        "recovery finds nothing to do for 'running'",
    )
    assert "shortest trace:" in report.render()


def test_a_stranding_only_visible_at_run_time_is_caught() -> None:
    # Recovery only requeues, and `interrupt` became an ordinary transition: every static
    # rule is satisfied...
    running_only_requeues = with_states(
        EXECUTION.model_copy(
            update={
                "transitions": tuple(
                    t.model_copy(update={"kind": TransitionKind.NORMAL})
                    if t.event == "interrupt"
                    else t
                    for t in EXECUTION.transitions
                )
            }
        ),
        running={"on_crash": recover_by("requeue", why="optimistic")},
    )
    load({"execution": running_only_requeues})
    # ...but when going on is unsafe (must_interrupt), nothing moves the dead owner's run.
    report = check_machine(running_only_requeues)
    [violation] = report.violations
    assert violation.invariant == "no state is stranded after recovery"
    assert violation.trace[-1] == "recovery finds nothing to do for 'running' [must_interrupt=True]"


def test_an_approval_consumed_twice_is_caught() -> None:
    reopen = TransitionSpec(
        event="reopen",
        source=("approved",),
        dest="awaiting_approval",
        kind=TransitionKind.RECOVERY,
        description="wrong: asks the person again after a crash, then reuses the answer",
    )
    planted = with_states(
        with_transitions(TOOL_CALL, reopen),
        approved={
            "on_crash": recover_by(
                "reopen", "withdraw_on_crash", otherwise=Otherwise.RECLAIM, why="x"
            )
        },
    )
    report = check_machine(planted)
    twice = next(v for v in report.violations if "approval" in v.invariant)
    assert "tool_call.approve" in twice.trace[-1]
    assert any("recover: tool_call.reopen" in step for step in twice.trace)


def test_a_non_idempotent_call_dispatched_twice_is_caught_in_the_product() -> None:
    careless = TOOL_CALL.model_copy(
        update={
            "transitions": tuple(
                t.model_copy(update={"conditions": ()}) if t.event == "redispatch" else t
                for t in TOOL_CALL.transitions
            )
        }
    )
    careless = with_states(
        careless,
        dispatched={"on_crash": recover_by("mark_in_doubt", why="x", otherwise=Otherwise.RECLAIM)},
    )
    machines = {**MACHINES, "tool_call": careless}
    report = check_composition(COMPOSITIONS["execution_with_tool_call"], machines)
    twice = next(v for v in report.violations if "non-idempotent" in v.invariant)
    # The shortest way there: the call is approved and sent in one commit, then again.
    assert twice.trace[-2:] == ("joint call_sent", "tool_call.redispatch")


def test_a_call_made_at_once_that_may_not_be_made_again_is_caught_in_the_product() -> None:
    """A call made before any intent is written is safe only if it may be made again: drop
    the guard and a crash before its journal entry commits makes a non-idempotent call
    twice."""
    careless = TOOL_CALL.model_copy(
        update={
            "transitions": tuple(
                t.model_copy(update={"conditions": ()}) if t.event == "succeed_at_least_once" else t
                for t in TOOL_CALL.transitions
            )
        }
    )
    machines = {**MACHINES, "tool_call": careless}
    report = check_composition(COMPOSITIONS["execution_with_tool_call"], machines)
    twice = next(v for v in report.violations if "non-idempotent" in v.invariant)
    assert twice.detail == "the non-idempotent tool is called a second time"
    assert twice.trace[-1].startswith("tool_call.succeed_at_least_once")


@pytest.mark.parametrize("unfenced", ["dispatch", "succeed", "auto_approve"])
def test_a_call_move_without_its_execution_fence_is_caught(unfenced: str) -> None:
    """The fences are part of the model: drop one and a stalled owner that wakes up after
    its execution was recovered moves the call, and the checker shows how it got there."""
    shipped = COMPOSITIONS["execution_with_tool_call"]
    careless = shipped.model_copy(
        update={"fenced": tuple(f for f in shipped.fenced if f != ("tool_call", unfenced))}
    )
    report = check_composition(careless, MACHINES)
    stale = [v for v in report.violations if v.invariant == "a stale owner never moves a call"]
    assert stale, report.render()
    assert any(f"tool_call.{unfenced}" in v.detail for v in stale)
    assert any("the owner stalls" in step for v in stale for step in v.trace)
    assert check_composition(shipped, MACHINES).ok


def test_recovery_deciding_on_a_call_that_moves_before_its_commit_is_caught() -> None:
    """Recovery reads the journal, then commits: a stalled owner that wakes in between (its
    execution not yet moved, so its own fence passes) and dispatches the call. Without the
    fence on the call, recovery requeues an execution whose call is in flight (the bug the
    real-process simulator once found under load); the checker shows the interleaving."""
    shipped = COMPOSITIONS["execution_with_tool_call"]
    careless = shipped.model_copy(update={"recovery_fenced": ()})
    report = check_composition(careless, MACHINES)
    stale = [v for v in report.violations if v.invariant.startswith("recovery commits")]
    assert {v.detail.split(",")[0] for v in stale} == {
        "recovery commits execution.requeue",
        "recovery commits execution.interrupt",
    }, report.render()
    assert all("moved it to 'dispatched'" in v.detail for v in stale)
    assert all(v.trace[-1].endswith("tries tool_call.dispatch") for v in stale)
    assert all("the owner stalls" in step for v in stale for step in v.trace[-2:-1])
    assert check_composition(shipped, MACHINES).ok


def test_a_ledger_entry_that_can_never_be_reported_is_caught() -> None:
    silent = OWED_REQUEST
    for event in ("report", "abandon", "abandon_on_crash"):
        silent = without_transition(silent, event)
    silent = with_states(
        silent, lost={"on_crash": recover_by(otherwise=Otherwise.DURABLE_WAIT, why="x")}
    )
    report = check_machine(silent)
    [violation] = report.violations
    assert violation.invariant == "every record can still reach a good end"
    assert "lost" in violation.detail


def test_a_changed_terminal_state_is_caught_at_run_time() -> None:
    revive = TransitionSpec(
        event="revive", source=("completed",), dest="running", description="never allowed"
    )
    report = check_machine(with_transitions(EXECUTION, revive))
    violation = next(v for v in report.violations if v.invariant.startswith("terminal"))
    assert "'revive' moves the terminal state 'completed'" in violation.detail


@pytest.mark.parametrize("machine", list(MACHINES.values()), ids=lambda m: m.name)
def test_exploration_is_deterministic(machine: spec.MachineSpec) -> None:
    first, second = check_machine(machine), check_machine(machine)
    assert (first.states, first.transitions) == (second.states, second.transitions)
