"""The enrolment lifecycle: a one-time link that lets a person register a passkey."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import MachineSpec, StateSpec, TransitionSpec, durable_wait


class EnrolmentStatus(StrEnum):
    ISSUED = "issued"
    USED = "used"
    EXPIRED = "expired"
    REVOKED = "revoked"


S = EnrolmentStatus

ENROLMENT = MachineSpec(
    name="enrolment",
    title="Enrolment link (a passkey's registration)",
    description=(
        "A one-time link printed on the operator's terminal (`lockgate approvers add`, "
        "`lockgate approvers enrol`, or the first `lockgate serve`), never sent to an agent, a "
        "log or a webhook. The person opens it and registers a passkey; the registration, the "
        "link's use and the person's first session commit in one transaction, so a link "
        "registers at most one passkey and a crash leaves it either unused or used with its "
        "passkey stored. The row keeps only the sha256 of the link's secret."
    ),
    status=EnrolmentStatus,
    states=(
        StateSpec(
            name=S.ISSUED,
            description="Waiting for the person to open it and register a passkey.",
            initial=True,
            on_crash=durable_wait(
                "Nothing runs for it: the person opens the link on any instance, after any "
                "restart, until it expires."
            ),
        ),
        StateSpec(
            name=S.USED,
            description="A passkey was registered with it (and the person signed in).",
            terminal=True,
        ),
        StateSpec(
            name=S.EXPIRED,
            description="Not used within LOCKGATE_ENROLMENT_TTL.",
            terminal=True,
        ),
        StateSpec(
            name=S.REVOKED,
            description="Replaced by a newer link for the same person, or the approver was "
            "removed.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="use",
            source=(S.ISSUED,),
            dest=S.USED,
            unless=("lifetime_over",),
            effects=("record_use",),
            description="The passkey registered through it is stored, with the person's "
            "first session, in the same transaction.",
        ),
        TransitionSpec(
            event="expire",
            source=(S.ISSUED,),
            dest=S.EXPIRED,
            conditions=("lifetime_over",),
            description="Found past its expiry, by a visit or by the maintenance round.",
        ),
        TransitionSpec(
            event="revoke",
            source=(S.ISSUED,),
            dest=S.REVOKED,
            description="A newer link was issued for the person, or the approver removed.",
        ),
    ),
)

__all__ = ["ENROLMENT", "EnrolmentStatus"]
