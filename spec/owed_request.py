"""The owed-request lifecycle: the ledger entry for a JSON-RPC request id a POST must answer."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import (
    EffectTiming,
    ExternalEffect,
    MachineSpec,
    Otherwise,
    StateSpec,
    TransitionKind,
    TransitionSpec,
    recover_by,
)


class OwedRequestStatus(StrEnum):
    OWED = "owed"
    ANSWERED = "answered"
    LOST = "lost"
    REPORTED = "reported"
    UNCOLLECTED = "uncollected"


S = OwedRequestStatus

OWED_REQUEST = MachineSpec(
    name="owed_request",
    title="Owed request (the request ledger)",
    description=(
        "Every request id a client is owed an answer for, with its session and incarnation. "
        "It ends answered, or lost and then reported with JSON-RPC error -32010 saying what "
        "became of the request's execution."
    ),
    status=OwedRequestStatus,
    good_ends=(S.ANSWERED, S.REPORTED, S.UNCOLLECTED),
    # The entry reaches the disk with the request's first commit that waits for it (an
    # execution's start: the log is written in order), before anything the request does
    # outside; a process's death keeps it regardless.
    creation_waits_for_disk=False,
    states=(
        StateSpec(
            name=S.OWED,
            description="The serving incarnation owes a response for this id.",
            initial=True,
            owned=True,
            on_crash=recover_by(
                "lose_in_crash",
                why="The incarnation that owed it died; the id is lost and waits to be "
                "reported on the session's next GET.",
            ),
        ),
        StateSpec(
            name=S.LOST,
            description="No response will come; the -32010 report is not delivered yet.",
            on_crash=recover_by(
                "abandon_on_crash",
                otherwise=Otherwise.DURABLE_WAIT,
                why="The report is written from the row on the session's next GET; if the "
                "session ended meanwhile (a crash can lose an id after its session expired), "
                "nobody can collect it and recovery abandons it.",
            ),
        ),
        StateSpec(
            name=S.ANSWERED,
            description="Its response was delivered.",
            terminal=True,
        ),
        StateSpec(
            name=S.REPORTED,
            description="The -32010 error (with the execution's fate) was delivered.",
            terminal=True,
        ),
        StateSpec(
            name=S.UNCOLLECTED,
            description="The session ended before the client came back for the report; the "
            "execution's own record still tells its fate.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="answer",
            source=(S.OWED,),
            dest=S.ANSWERED,
            external_effect=ExternalEffect(
                name="write_response",
                timing=EffectTiming.BEFORE_COMMIT,
                description="Write the response on the stream, then consume the entry, so a "
                "crash in between reports it rather than forgetting it.",
            ),
            # The response is on the wire already; lost only with the machine, the entry is
            # reported lost as well (the client's own answer was delivered).
            waits_for_disk=False,
            description="The response is delivered.",
        ),
        TransitionSpec(
            event="lose",
            source=(S.OWED,),
            dest=S.LOST,
            description="The stream closed abnormally, the response deadline passed, or the "
            "server is draining.",
        ),
        TransitionSpec(
            event="report",
            source=(S.LOST,),
            dest=S.REPORTED,
            external_effect=ExternalEffect(
                name="write_lost_error",
                timing=EffectTiming.BEFORE_COMMIT,
                description="Write JSON-RPC error -32010 for the id, then mark it reported.",
            ),
            description="The error is delivered (on the same stream, or the next GET).",
        ),
        TransitionSpec(
            event="abandon",
            source=(S.LOST,),
            dest=S.UNCOLLECTED,
            conditions=("session_ended",),
            description="Its session expired or closed before the report was collected.",
        ),
        TransitionSpec(
            event="abandon_on_crash",
            source=(S.LOST,),
            dest=S.UNCOLLECTED,
            conditions=("session_ended",),
            kind=TransitionKind.RECOVERY,
            description="Recovery: the id was lost after its session had ended (its "
            "incarnation died after the session expired or closed), so nobody can collect it.",
        ),
        TransitionSpec(
            event="lose_in_crash",
            source=(S.OWED,),
            dest=S.LOST,
            kind=TransitionKind.RECOVERY,
            description="Recovery: the owing incarnation is dead.",
        ),
    ),
)

__all__ = ["OWED_REQUEST", "OwedRequestStatus"]
