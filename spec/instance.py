"""The instance lifecycle: one server process incarnation and its heartbeat lease."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import MachineSpec, StateSpec, TransitionKind, TransitionSpec, recover_by


class InstanceStatus(StrEnum):
    LIVE = "live"
    DRAINING = "draining"
    STOPPED = "stopped"
    DEAD = "dead"


S = InstanceStatus

INSTANCE = MachineSpec(
    name="instance",
    title="Instance",
    description=(
        "A server process. Each start is a new incarnation (epoch) with a lease row it renews "
        "by heartbeat; when the lease lapses any other instance declares it dead and recovers "
        "its live work."
    ),
    status=InstanceStatus,
    states=(
        StateSpec(
            name=S.LIVE,
            description="Serving, heartbeating, owning work.",
            initial=True,
            owned=True,
            on_crash=recover_by(
                "declare_dead",
                why="Its lease lapses; another instance (or its own next incarnation) "
                "declares it dead and recovers its work.",
            ),
        ),
        StateSpec(
            name=S.DRAINING,
            description="SIGTERM received: accepts nothing new, answers or reports what it owes.",
            owned=True,
            on_crash=recover_by("declare_dead", why="Same as live: the lease lapses."),
        ),
        StateSpec(name=S.STOPPED, description="Drained and exited cleanly.", terminal=True),
        StateSpec(
            name=S.DEAD,
            description="Its lease lapsed; its live work was handed to recovery.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="heartbeat",
            source=(S.LIVE,),
            dest=S.LIVE,
            effects=("extend_lease",),
            description="Renew the lease.",
        ),
        TransitionSpec(
            event="heartbeat",
            source=(S.DRAINING,),
            dest=S.DRAINING,
            effects=("extend_lease",),
            description="Renew the lease while draining (answering what it owes takes time).",
        ),
        TransitionSpec(
            event="drain",
            source=(S.LIVE,),
            dest=S.DRAINING,
            description="SIGTERM: stop accepting work.",
        ),
        TransitionSpec(
            event="stop",
            source=(S.DRAINING,),
            dest=S.STOPPED,
            effects=("release_work",),
            description="Everything owed is answered or reported; exit.",
        ),
        TransitionSpec(
            event="declare_dead",
            source=(S.LIVE, S.DRAINING),
            dest=S.DEAD,
            kind=TransitionKind.RECOVERY,
            description="Recovery, once the lease lapsed: its live work is recovered by others.",
        ),
    ),
)

__all__ = ["INSTANCE", "InstanceStatus"]
