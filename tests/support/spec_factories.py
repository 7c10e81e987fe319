"""Small builders for planting mistakes in otherwise sound specs."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import MachineSpec, StateSpec, TransitionSpec


def with_states(
    spec: MachineSpec, extra: tuple[StateSpec, ...] = (), **replaced: dict[str, object]
) -> MachineSpec:
    """`spec` with some states changed (by name) and `extra` states appended; the status
    enum is rebuilt to match."""
    states = (
        tuple(
            s.model_copy(update=replaced[s.name]) if s.name in replaced else s for s in spec.states
        )
        + extra
    )
    status = StrEnum(  # type: ignore[misc]
        spec.status.__name__, {s.name.upper(): s.name for s in states}
    )
    return spec.model_copy(update={"states": states, "status": status})


def with_transitions(spec: MachineSpec, *extra: TransitionSpec) -> MachineSpec:
    return spec.model_copy(update={"transitions": spec.transitions + extra})


def without_transition(spec: MachineSpec, event: str) -> MachineSpec:
    return spec.model_copy(
        update={"transitions": tuple(t for t in spec.transitions if t.event != event)}
    )
