"""Crash points, derived from the spec and never listed by hand.

Every durable transition has a point before its commit and one after; a transition with an
external effect also has one after the effect. Adding a transition to a spec adds its points.
A row inserted in a transaction of its own (`MachineSpec.created_alone`) has two more, named
`<machine>:create:new-><initial state>:<phase>`: its creation is a commit a crash can precede
or follow like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockgate.spec.model import EffectTiming, MachineSpec, Phase, TransitionSpec


@dataclass(frozen=True, order=True)
class CrashPoint:
    machine: str
    event: str
    source: str
    dest: str
    phase: Phase

    @property
    def name(self) -> str:
        return f"{self.machine}:{self.event}:{self.source}->{self.dest}:{self.phase}"

    @classmethod
    def parse(cls, name: str) -> CrashPoint:
        """The inverse of `name` (for points armed through an environment variable)."""
        try:
            machine, event, edge, phase = name.split(":")
            source, dest = edge.split("->")
        except ValueError:
            raise ValueError(
                f"not a crash point name: {name!r} (expected machine:event:source->dest:phase)"
            ) from None
        if phase not in ("before_commit", "after_commit", "after_effect"):
            raise ValueError(f"unknown crash phase {phase!r} in {name!r}")
        return cls(machine, event, source, dest, phase)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.name


def phases(t: TransitionSpec) -> tuple[Phase, ...]:
    """The crash phases of one transition, in the order the write path passes them."""
    if not t.durable:
        return ()
    if t.external_effect is None:
        return ("before_commit", "after_commit")
    if t.external_effect.timing is EffectTiming.AFTER_COMMIT:
        return ("before_commit", "after_commit", "after_effect")
    # Effect first: the effect runs before the transaction, then the row is committed.
    return ("after_effect", "before_commit", "after_commit")


def crash_points_of(t: TransitionSpec, machine: str) -> tuple[CrashPoint, ...]:
    return tuple(
        CrashPoint(machine, t.event, source, t.dest, phase)
        for source in t.source
        for phase in phases(t)
    )


def crash_points(spec: MachineSpec) -> tuple[CrashPoint, ...]:
    return tuple(p for t in spec.transitions for p in crash_points_of(t, spec.name))


#: The event and source that name a row's creation (it comes from no state).
CREATE = "create"
NEW = "new"


def creation_points(spec: MachineSpec) -> tuple[CrashPoint, ...]:
    """The points a row passes when it is inserted alone, in its initial state."""
    if not spec.created_alone:
        return ()
    phases_: tuple[Phase, ...] = ("before_commit", "after_commit")
    return tuple(CrashPoint(spec.name, CREATE, NEW, spec.initial.name, p) for p in phases_)


def every_crash_point(spec: MachineSpec) -> tuple[CrashPoint, ...]:
    """Its transitions' points and its creation's: everything the simulator must reach."""
    return creation_points(spec) + crash_points(spec)
