"""The webhook outbox's reads: rows due for an attempt, approvals owed a warning, and the
operator's listing (`lockgate webhook list`)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import col, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import Execution, ToolCall, WebhookDelivery
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C
from lockgate.spec import WebhookDeliveryStatus as W


class WebhookQueries(Queries):
    def due(self, now: datetime, limit: int) -> list[WebhookDelivery]:
        """Up to `limit` queued rows whose next attempt is due, the longest waiting first
        (index `ix_webhook_deliveries_due`)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(WebhookDelivery)
                    .where(
                        WebhookDelivery.status == W.QUEUED,
                        col(WebhookDelivery.next_attempt_at) <= now,
                    )
                    .order_by(col(WebhookDelivery.next_attempt_at))
                    .limit(limit)
                )
            )

    def next_due_at(self) -> datetime | None:
        """When the earliest queued row is due (None: nothing is queued)."""
        with self._session() as s:
            return s.exec(
                select(WebhookDelivery.next_attempt_at)
                .where(WebhookDelivery.status == W.QUEUED)
                .order_by(col(WebhookDelivery.next_attempt_at))
                .limit(1)
            ).first()

    def expiring_unwarned(
        self, now: datetime, until: datetime, kind: str, limit: int
    ) -> list[tuple[Execution, ToolCall]]:
        """Paused executions whose deadline falls in (now, until], with the call that waits,
        that have no `kind` row yet."""
        # The warning of that very call (an execution may pause on several in turn).
        warned = (
            select(WebhookDelivery.id)
            .where(
                WebhookDelivery.kind == kind,
                col(WebhookDelivery.execution_id) == col(Execution.id),
                col(WebhookDelivery.call_seq) == col(ToolCall.seq),
            )
            .exists()
        )
        with self._session() as s:
            rows = s.exec(
                select(Execution, ToolCall)
                .join(ToolCall, col(ToolCall.execution_id) == col(Execution.id))
                .where(
                    Execution.status == E.WAITING_FOR_INTERACTION,
                    col(Execution.deadline) > now,
                    col(Execution.deadline) <= until,
                    ToolCall.status == C.AWAITING_APPROVAL,
                    ~warned,
                )
                .order_by(col(Execution.deadline))
                .limit(limit)
            )
            return [(ex, call) for ex, call in rows]

    def get(self, delivery_id: str) -> WebhookDelivery | None:
        """One row by its event id."""
        return self._get(WebhookDelivery, delivery_id)

    def recent(self, limit: int, status: str | None = None) -> list[WebhookDelivery]:
        """The newest rows (of one status, if given), for the operator."""
        query = select(WebhookDelivery)
        if status is not None:
            query = query.where(WebhookDelivery.status == status)
        with self._session() as s:
            return list(s.exec(query.order_by(col(WebhookDelivery.created_at).desc()).limit(limit)))
