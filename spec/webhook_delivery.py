"""The webhook delivery lifecycle: the outbox row of one event an operator's endpoint is owed."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import (
    EffectTiming,
    ExternalEffect,
    MachineSpec,
    StateSpec,
    TransitionSpec,
    durable_wait,
)


class WebhookDeliveryStatus(StrEnum):
    QUEUED = "queued"
    DELIVERED = "delivered"
    ABANDONED = "abandoned"


S = WebhookDeliveryStatus

WEBHOOK_DELIVERY = MachineSpec(
    name="webhook_delivery",
    title="Webhook delivery (the outbox)",
    description=(
        "One event (an approval requested, an approval about to expire) owed to the "
        "operator's webhook endpoint. The row is written in the transaction that makes the "
        "event true (an approval request's row with the pause itself), so a crash loses "
        "none; it is POSTed, signed, until the endpoint answers 2xx, at least once, with "
        "backoff between attempts, and abandoned only after its last attempt."
    ),
    status=WebhookDeliveryStatus,
    # Abandoned is an end too: the row keeps its last error, and the approval it announced
    # is still decided through every other door (the webhook is a relay, never the gate).
    # An approval request's row rides with the pause; a warning's row is inserted alone
    # (its creation has crash points of its own).
    created_alone=True,
    states=(
        StateSpec(
            name=S.QUEUED,
            description="Owed to the endpoint; due at its next attempt time.",
            initial=True,
            on_crash=durable_wait(
                "Everything needed to send it is in the row: any live instance's delivery "
                "loop claims it once its claim (or backoff) lapses."
            ),
        ),
        StateSpec(
            name=S.DELIVERED,
            description="The endpoint answered 2xx.",
            terminal=True,
        ),
        StateSpec(
            name=S.ABANDONED,
            description="Every attempt failed; the row keeps the last error for the operator.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="claim",
            source=(S.QUEUED,),
            dest=S.QUEUED,
            conditions=("delivery_due",),
            effects=("claim_attempt",),
            description="An instance takes the due row for one attempt (its next attempt "
            "time moves past the attempt's bound, so no other instance sends it meanwhile).",
        ),
        TransitionSpec(
            event="deliver",
            source=(S.QUEUED,),
            dest=S.DELIVERED,
            effects=("record_delivery",),
            external_effect=ExternalEffect(
                name="post_webhook",
                timing=EffectTiming.BEFORE_COMMIT,
                description="POST the signed event and see a 2xx, then mark it delivered: "
                "a crash in between sends it again (the receiver dedupes on its id).",
            ),
            description="The endpoint accepted the event.",
        ),
        TransitionSpec(
            event="retry",
            source=(S.QUEUED,),
            dest=S.QUEUED,
            unless=("attempts_exhausted",),
            effects=("schedule_retry",),
            description="The attempt failed (refused, an error status, a timeout); the "
            "next one is due after an exponential backoff.",
        ),
        TransitionSpec(
            event="abandon",
            source=(S.QUEUED,),
            dest=S.ABANDONED,
            conditions=("attempts_exhausted",),
            effects=("record_failure",),
            description="The last attempt failed too.",
        ),
    ),
)

__all__ = ["WEBHOOK_DELIVERY", "WebhookDeliveryStatus"]
