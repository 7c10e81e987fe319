"""The webhook outbox's invariants, on what was persisted and what the endpoint received."""

from __future__ import annotations

from lockgate.machine.db.audit_queries import AuditQueries, Engine
from lockgate.machine.webhooks import REQUESTED, event_id
from lockgate.simulation.invariants import Violation
from lockgate.simulation.webhook_endpoint import WebhookEndpoint
from lockgate.spec import WebhookDeliveryStatus as W

WEBHOOK_INVARIANTS = (
    "every call paused for approval has its approval.requested event queued with the pause",
    "every delivered event reached the endpoint, signed; none is left queued",
)


def check_webhooks(engine: Engine, endpoint: WebhookEndpoint) -> list[Violation]:
    """With webhooks on: no pause without its event, no delivered event the endpoint did not
    verify, no event left queued once the run is over."""
    audit = AuditQueries(engine)
    rows = {r.id: r for r in audit.webhook_deliveries()}
    found: list[Violation] = []
    paused = {
        t.record_id
        for t in audit.transitions()
        if t.machine == "tool_call" and t.event == "request_approval"
    }
    for call_id in sorted(paused):
        execution_id, seq = call_id.rsplit(":", 1)
        if event_id(REQUESTED, execution_id, int(seq)) not in rows:
            found.append(
                Violation(WEBHOOK_INVARIANTS[0], f"call {call_id} paused without its event")
            )
    for row in rows.values():
        if row.status == W.DELIVERED and row.id not in endpoint.received:
            found.append(
                Violation(WEBHOOK_INVARIANTS[1], f"{row.id} is delivered; nobody received it")
            )
        if row.status == W.QUEUED:
            found.append(Violation(WEBHOOK_INVARIANTS[1], f"{row.id} is still queued"))
    found += [
        Violation(WEBHOOK_INVARIANTS[1], f"an attempt of {forged} was not signed right")
        for forged in endpoint.forged
    ]
    return found
