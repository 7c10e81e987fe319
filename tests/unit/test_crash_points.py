"""Crash points are derived from the spec: a new transition is new points, automatically."""

from __future__ import annotations

import pytest

from lockgate.spec import EXECUTION, OWED_REQUEST, TOOL_CALL, CrashPoint, crash_points
from lockgate.spec.crash_points import phases
from lockgate.spec.model import EffectTiming, ExternalEffect, TransitionSpec
from tests.support.spec_factories import with_transitions


def test_every_durable_transition_has_before_and_after_commit_points() -> None:
    points = {p.name for p in crash_points(EXECUTION)}
    for t in EXECUTION.transitions:
        for source in t.source:
            assert f"execution:{t.event}:{source}->{t.dest}:before_commit" in points
            assert f"execution:{t.event}:{source}->{t.dest}:after_commit" in points


def test_external_effects_add_an_after_effect_point_in_the_order_they_run() -> None:
    dispatch = next(t for t in TOOL_CALL.transitions if t.event == "dispatch")
    assert phases(dispatch) == ("before_commit", "after_commit", "after_effect")
    answer = next(t for t in OWED_REQUEST.transitions if t.event == "answer")
    assert answer.external_effect is not None
    assert answer.external_effect.timing is EffectTiming.BEFORE_COMMIT
    assert phases(answer) == ("after_effect", "before_commit", "after_commit")


def test_adding_a_transition_adds_its_crash_points() -> None:
    before = set(crash_points(EXECUTION))
    grown = with_transitions(
        EXECUTION,
        TransitionSpec(
            event="notify",
            source=("running", "pending"),
            dest="running",
            external_effect=ExternalEffect(name="ping", description="tell someone"),
            description="a new durable transition with an effect",
        ),
    )
    added = set(crash_points(grown)) - before
    assert {p.name for p in added} == {
        f"execution:notify:{s}->running:{phase}"
        for s in ("running", "pending")
        for phase in ("before_commit", "after_commit", "after_effect")
    }


def test_non_durable_transitions_have_no_points() -> None:
    grown = with_transitions(
        EXECUTION,
        TransitionSpec(
            event="peek", source=("running",), dest="running", durable=False, description="x"
        ),
    )
    assert set(crash_points(grown)) == set(crash_points(EXECUTION))


def test_crash_point_names_round_trip() -> None:
    for point in crash_points(TOOL_CALL):
        assert CrashPoint.parse(point.name) == point
    with pytest.raises(ValueError, match="not a crash point name"):
        CrashPoint.parse("execution:start")
    with pytest.raises(ValueError, match="unknown crash phase"):
        CrashPoint.parse("execution:start:pending->running:sometime")
