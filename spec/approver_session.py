"""The approver session lifecycle: a person signed in to decide approvals (a cookie)."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import MachineSpec, StateSpec, TransitionSpec, durable_wait


class ApproverSessionStatus(StrEnum):
    ACTIVE = "active"
    SIGNED_OUT = "signed_out"
    EXPIRED = "expired"


S = ApproverSessionStatus

APPROVER_SESSION = MachineSpec(
    name="approver_session",
    title="Approver session (a person signed in)",
    description=(
        "A person who signed in (OpenID Connect, or a passkey) to decide the calls of the "
        "principals they approve for. The browser holds a cookie naming the row and a secret "
        "only the browser has (the row keeps its sha256), so any instance, after any restart, "
        "knows the person on their next request. Its lifetime is bounded and it can be ended "
        "at any time; every decision it makes names the person in its audit record."
    ),
    status=ApproverSessionStatus,
    states=(
        StateSpec(
            name=S.ACTIVE,
            description="Signed in: the cookie identifies the person until the expiry.",
            initial=True,
            on_crash=durable_wait(
                "Nothing runs for it: the row is the session, read on the person's next "
                "request by whichever instance serves it."
            ),
        ),
        StateSpec(
            name=S.SIGNED_OUT,
            description="Ended by the person, by the operator (`lockgate approvers sign-out`), "
            "or because the approver was removed.",
            terminal=True,
        ),
        StateSpec(
            name=S.EXPIRED,
            description="Its lifetime (LOCKGATE_APPROVER_SESSION_TTL) is over.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="sign_out",
            source=(S.ACTIVE,),
            dest=S.SIGNED_OUT,
            effects=("record_end",),
            description="The cookie stops naming anyone, on every instance at once.",
        ),
        TransitionSpec(
            event="expire",
            source=(S.ACTIVE,),
            dest=S.EXPIRED,
            conditions=("lifetime_over",),
            effects=("record_end",),
            description="Found past its expiry, by a request or by the maintenance round.",
        ),
    ),
)

__all__ = ["APPROVER_SESSION", "ApproverSessionStatus"]
