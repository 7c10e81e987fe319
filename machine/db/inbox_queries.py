"""The approvals inbox's read: a principal's executions that wait for a decision, newest
first (index `ix_executions_principal` on principal and creation time)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import col, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import Execution
from lockgate.spec import ExecutionStatus as E


class InboxQueries(Queries):
    def waiting_ids(self, principal_id: str, limit: int) -> list[str]:
        """Up to `limit` of the principal's paused executions, the newest first."""
        with self._session() as s:
            return list(
                s.exec(
                    select(Execution.id)
                    .where(
                        Execution.principal_id == principal_id,
                        Execution.status == E.WAITING_FOR_INTERACTION,
                    )
                    .order_by(col(Execution.created_at).desc())
                    .limit(limit)
                )
            )

    def expiring_in_session(
        self, session_id: str, now: datetime, until: datetime, limit: int
    ) -> list[Execution]:
        """Up to `limit` paused executions started on the session whose deadline falls in
        (now, until], the nearest first (index `ix_executions_live_session`)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(Execution)
                    .where(
                        Execution.session_id == session_id,
                        Execution.status == E.WAITING_FOR_INTERACTION,
                        col(Execution.deadline) > now,
                        col(Execution.deadline) <= until,
                    )
                    .order_by(col(Execution.deadline))
                    .limit(limit)
                )
            )
