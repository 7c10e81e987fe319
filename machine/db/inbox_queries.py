"""The approvals inbox's read: the executions of the principals a person approves for that
wait for a decision, newest first (index `ix_executions_principal` on principal and
creation time)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cache

from sqlalchemy import and_, bindparam
from sqlmodel import col, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C


@cache
def _expiring_in_session() -> SelectOfScalar[Execution]:
    """Built once: every request of a 2025 session asks it (its notices)."""
    return (
        select(Execution)
        .where(
            Execution.session_id == bindparam("session_id"),
            Execution.status == E.WAITING_FOR_INTERACTION,
            col(Execution.deadline) > bindparam("now"),
            col(Execution.deadline) <= bindparam("until"),
        )
        .order_by(col(Execution.deadline))
        .limit(bindparam("limit"))
    )


class InboxQueries(Queries):
    def waiting(self, principals: Sequence[str] | None, limit: int) -> list[tuple[str, str]]:
        """Up to `limit` executions of `principals` (None: of every principal) paused on a
        call that waits for approval, the newest first, as (execution id, principal). One
        whose tool asked its user questions is not there: those are the client's to answer."""
        query = (
            select(Execution.id, Execution.principal_id)
            .join(
                ToolCall,
                and_(
                    col(ToolCall.execution_id) == col(Execution.id),
                    col(ToolCall.seq) == col(Execution.snapshot_call),
                ),
            )
            .where(
                Execution.status == E.WAITING_FOR_INTERACTION,
                ToolCall.status == C.AWAITING_APPROVAL,
            )
        )
        if principals is not None:
            query = query.where(col(Execution.principal_id).in_(list(principals)))
        query = query.order_by(col(Execution.created_at).desc()).limit(limit)
        with self._session() as s:
            return [(execution_id, principal) for execution_id, principal in s.exec(query)]

    def expiring_in_session(
        self, session_id: str, now: datetime, until: datetime, limit: int
    ) -> list[Execution]:
        """Up to `limit` paused executions started on the session whose deadline falls in
        (now, until], the nearest first (index `ix_executions_live_session`)."""
        wanted = {"session_id": session_id, "now": now, "until": until, "limit": limit}
        return self._models(Execution, _expiring_in_session(), wanted)
