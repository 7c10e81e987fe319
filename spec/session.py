"""The session lifecycle: a 2025-protocol MCP session (`Mcp-Session-Id`), stored as a row."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import (
    MachineSpec,
    StateSpec,
    TransitionKind,
    TransitionSpec,
    durable_wait,
    recover_by,
)


class SessionStatus(StrEnum):
    ACTIVE = "active"
    IDLE = "idle"
    EXPIRED = "expired"
    CLOSED = "closed"


S = SessionStatus

SESSION = MachineSpec(
    name="session",
    title="Session",
    description=(
        "A 2025-protocol MCP session. Its row (principal, client info, protocol version, last "
        "activity, incarnation, the log level the client set) lets any instance serve it "
        "after a restart without a new initialize. Its lease is decided by a pure function "
        "of (now, last activity, work in flight, owed requests of the current incarnation)."
    ),
    status=SessionStatus,
    states=(
        StateSpec(
            name=S.ACTIVE,
            description="An instance is serving at least one of its requests.",
            initial=True,
            owned=True,
            on_crash=recover_by(
                "release",
                why="The serving incarnation died; the session goes idle and its unanswered "
                "requests are reported by the owed-request ledger.",
            ),
        ),
        StateSpec(
            name=S.IDLE,
            description="No request in flight; the row waits for the next one or its lease.",
            on_crash=durable_wait("Any instance serves its next request from the row."),
        ),
        StateSpec(
            name=S.EXPIRED,
            description="The lease decided destroy (idle too long, or past the cap).",
            terminal=True,
        ),
        StateSpec(name=S.CLOSED, description="The client sent DELETE.", terminal=True),
    ),
    transitions=(
        TransitionSpec(
            event="begin_request",
            source=(S.IDLE,),
            dest=S.ACTIVE,
            effects=("touch",),
            # Activity bookkeeping: lost only with the machine, it costs at most an early
            # or late expiry of an idle session.
            waits_for_disk=False,
            description="A request arrives (on any instance).",
        ),
        TransitionSpec(
            event="end_request",
            source=(S.ACTIVE,),
            dest=S.IDLE,
            effects=("touch",),
            # Activity bookkeeping: lost only with the machine, it costs at most an early
            # or late expiry of an idle session.
            waits_for_disk=False,
            description="Its last request in flight finished.",
        ),
        TransitionSpec(
            event="set_log_level",
            source=(S.ACTIVE,),
            dest=S.ACTIVE,
            effects=("record_log_level",),
            # A client's preference: lost only with the machine, it costs a notice sent that
            # the client asked not to see, or one held back, until it asks again.
            waits_for_disk=False,
            description="logging/setLevel: the least severe notices the client wants.",
        ),
        TransitionSpec(
            event="set_log_level",
            source=(S.IDLE,),
            dest=S.IDLE,
            effects=("record_log_level",),
            waits_for_disk=False,
            description="logging/setLevel while another instance ended its last request.",
        ),
        TransitionSpec(
            event="destroy",
            source=(S.ACTIVE, S.IDLE),
            dest=S.EXPIRED,
            conditions=("lease_says_destroy",),
            description="The lease decision is destroy; its executions are untouched.",
        ),
        TransitionSpec(
            event="close",
            source=(S.ACTIVE, S.IDLE),
            dest=S.CLOSED,
            description="DELETE on the session.",
        ),
        TransitionSpec(
            event="release",
            source=(S.ACTIVE,),
            dest=S.IDLE,
            kind=TransitionKind.RECOVERY,
            description="Recovery: the serving incarnation is gone.",
        ),
    ),
)

__all__ = ["SESSION", "SessionStatus"]
