"""Every static rule of the spec loader, each planted once into a sound spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import lockgate.spec as spec
from lockgate.machine.bindings import binding_names
from lockgate.spec import EXECUTION, SESSION, Rule, SpecInvalid, check, load
from lockgate.spec.model import (
    ExternalEffect,
    MachineSpec,
    OnCrash,
    StateSpec,
    TransitionKind,
    TransitionSpec,
    durable_wait,
)
from tests.support.spec_factories import with_states, with_transitions, without_transition


def rules(machine: MachineSpec) -> set[Rule]:
    return {v.rule for v in check(machine, binding_names()[machine.name])}


def test_the_shipped_specs_are_sound_and_fully_bound() -> None:
    loaded = load(bindings=binding_names())
    assert set(loaded) == {
        "execution",
        "tool_call",
        "session",
        "owed_request",
        "instance",
        "webhook_delivery",
        "approver_session",
        "enrolment",
    }


def test_every_non_terminal_state_says_what_a_crash_does() -> None:
    for machine in spec.MACHINES.values():
        for state in machine.states:
            assert state.terminal or state.on_crash is not None, (machine.name, state.name)


def test_unreachable_state_is_rejected() -> None:
    limbo = StateSpec(name="limbo", description="never entered", on_crash=durable_wait("x"))
    planted = with_transitions(
        with_states(EXECUTION, extra=(limbo,)),
        TransitionSpec(event="leave", source=("limbo",), dest="failed", description="out"),
    )
    violations = check(planted)
    [v] = [v for v in violations if v.rule is Rule.UNREACHABLE]
    assert v.machine == "execution" and "limbo" in v.subject
    assert "execution: state 'limbo': [unreachable_state]" in str(v)


def test_state_without_path_to_terminal_is_rejected() -> None:
    loop = StateSpec(name="spinning", description="spins", on_crash=durable_wait("x"))
    planted = with_transitions(
        with_states(EXECUTION, extra=(loop,)),
        TransitionSpec(
            event="spin", source=("pending",), dest="spinning", description="into the loop"
        ),
        TransitionSpec(event="again", source=("spinning",), dest="spinning", description="loop"),
    )
    [v] = [v for v in check(planted) if v.rule is Rule.NO_PATH_TO_TERMINAL]
    assert "spinning" in v.subject


def test_edge_leaving_a_terminal_state_is_rejected() -> None:
    planted = with_transitions(
        EXECUTION,
        TransitionSpec(event="revive", source=("completed",), dest="running", description="no"),
    )
    [v] = [v for v in check(planted) if v.rule is Rule.EDGE_FROM_TERMINAL]
    assert "revive" in v.subject and "completed" in v.detail


def test_non_terminal_state_without_recovery_edge_is_rejected() -> None:
    planted = with_states(EXECUTION, running={"on_crash": None})
    violations = check(planted)
    [v] = [v for v in violations if v.rule is Rule.NO_RECOVERY_EDGE]
    assert v.subject == "state 'running'"


def test_recovery_edge_must_exist_and_be_a_recovery_transition() -> None:
    planted = with_states(SESSION, active={"on_crash": OnCrash(events=("close",), why="wrongly")})
    found = [v for v in check(planted) if v.rule is Rule.BAD_RECOVERY_EDGE]
    details = " ".join(v.detail for v in found)
    assert "not declared kind=recovery" in details  # close is a normal transition
    assert "never uses it" in details  # release is now an orphan recovery transition


def test_unbound_guard_and_effect_names_are_rejected() -> None:
    planted = with_transitions(
        without_transition(EXECUTION, "cancel"),
        TransitionSpec(
            event="cancel",
            source=("pending",),
            dest="cancelled",
            conditions=("moon_is_full",),
            effects=("sing",),
            description="unbound names",
        ),
    )
    found = [v for v in check(planted, binding_names()["execution"]) if v.rule is Rule.UNBOUND_NAME]
    assert {v.detail for v in found} == {
        "guard 'moon_is_full' is not bound",
        "effect 'sing' is not bound",
    }
    # Without the machine layer's bindings the same spec is structurally fine.
    assert Rule.UNBOUND_NAME not in {v.rule for v in check(planted)}


def test_ambiguous_transitions_are_rejected_unless_guards_exclude_each_other() -> None:
    ambiguous = with_transitions(
        EXECUTION,
        TransitionSpec(event="start", source=("pending",), dest="failed", description="2nd"),
    )
    [v] = [v for v in check(ambiguous) if v.rule is Rule.AMBIGUOUS]
    assert "'start' from 'pending'" in v.subject and "'running'" in v.detail

    same_guard = with_transitions(
        EXECUTION,
        TransitionSpec(
            event="expire",
            source=("waiting_for_interaction",),
            dest="failed",
            conditions=("deadline_passed",),
            description="overlaps the real expire",
        ),
    )
    assert Rule.AMBIGUOUS in {v.rule for v in check(same_guard)}
    # requeue/interrupt share a source but `must_interrupt` separates them: not ambiguous.
    assert Rule.AMBIGUOUS not in {v.rule for v in check(EXECUTION)}


def test_malformed_specs_name_the_problem() -> None:
    planted = with_transitions(
        EXECUTION,
        TransitionSpec(event="warp", source=("running",), dest="nowhere", description="bad"),
    )
    [v] = check(planted)
    assert v.rule is Rule.MALFORMED and "undeclared state 'nowhere'" in v.detail

    mismatched = EXECUTION.model_copy(update={"status": spec.SessionStatus})
    assert any("differ from the declared states" in v.detail for v in check(mismatched))

    effect_without_write = with_transitions(
        EXECUTION,
        TransitionSpec(
            event="beep",
            source=("running",),
            dest="running",
            durable=False,
            external_effect=ExternalEffect(name="beep", description="a sound"),
            description="no write",
        ),
    )
    assert any("needs a durable write" in v.detail for v in check(effect_without_write))


@pytest.mark.parametrize("event", ["dispatch", "approve"])
def test_an_intent_or_a_decision_that_does_not_wait_for_the_disk_is_rejected(event: str) -> None:
    """Lost with the machine, an intent would let its effect happen twice, and a consumed
    approval would be asked for again: both must wait for the disk."""
    tool_call = spec.MACHINES["tool_call"]
    careless = tool_call.model_copy(
        update={
            "transitions": tuple(
                t.model_copy(update={"waits_for_disk": False}) if t.event == event else t
                for t in tool_call.transitions
            )
        }
    )
    [v] = check(careless)
    assert v.rule is Rule.MALFORMED and "must wait for the disk" in v.detail
    assert event in v.subject


def test_declarations_are_validated_when_built() -> None:
    with pytest.raises(ValidationError, match="terminal state 'done' cannot"):
        StateSpec(name="done", description="d", terminal=True, on_crash=durable_wait("x"))
    with pytest.raises(ValidationError, match="on_crash needs recovery events"):
        OnCrash(why="nothing")
    with pytest.raises(ValidationError):
        TransitionSpec(event="Bad Name", source=("a",), dest="b", description="x")
    with pytest.raises(ValidationError):
        TransitionSpec(event="x", source=(), dest="b", description="x")


def test_load_lists_every_violation_of_every_machine() -> None:
    broken = with_states(EXECUTION, running={"on_crash": None})
    broken_session = with_transitions(
        SESSION,
        TransitionSpec(
            event="reopen",
            source=("closed",),
            dest="active",
            kind=TransitionKind.NORMAL,
            description="x",
        ),
    )
    with pytest.raises(SpecInvalid) as info:
        load({"execution": broken, "session": broken_session})
    message = str(info.value)
    assert "execution: state 'running': [no_recovery_edge]" in message
    assert "session: transition 'reopen' (closed -> active): [edge_from_terminal]" in message
    # Removing running's recovery edge also orphans its two recovery transitions.
    assert sorted(v.rule for v in info.value.violations) == sorted(
        [
            Rule.NO_RECOVERY_EDGE,
            Rule.BAD_RECOVERY_EDGE,
            Rule.BAD_RECOVERY_EDGE,
            Rule.EDGE_FROM_TERMINAL,
        ]
    )
