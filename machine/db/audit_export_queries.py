"""The decisions on gated calls, for `lockgate audit export` (every tool call a person, or
the server, decided, with its execution's principal, oldest decision first) and for the
approvals inbox's history (the latest ones of the principals a person approves for).

A separate reader from `ToolCallQueries` (the engine's per-call reads): this one scans the
journal's decided calls in bulk, for operators, never on a request's path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlmodel import col, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import Execution, ToolCall

#: Rows read per round trip while exporting (the journal may hold millions).
BATCH = 500


class AuditExportQueries(Queries):
    def decided(
        self, *, principal_id: str | None = None, since: datetime | None = None
    ) -> Iterator[tuple[ToolCall, str]]:
        """Each decided call with its execution's principal, by decision time, in batches
        (`principal_id`: only that principal's; `since`: decided at or after it)."""
        after: tuple[datetime, str] | None = None
        while True:
            query = (
                select(ToolCall, Execution.principal_id)
                .join(Execution, col(Execution.id) == col(ToolCall.execution_id))
                .where(col(ToolCall.decided_at).is_not(None))
            )
            if principal_id is not None:
                query = query.where(Execution.principal_id == principal_id)
            if since is not None:
                query = query.where(col(ToolCall.decided_at) >= since)
            if after is not None:
                at, call_id = after
                query = query.where(
                    (col(ToolCall.decided_at) > at)
                    | ((col(ToolCall.decided_at) == at) & (col(ToolCall.id) > call_id))
                )
            query = query.order_by(col(ToolCall.decided_at), col(ToolCall.id)).limit(BATCH)
            with self._session() as s:
                rows = list(s.exec(query))
            yield from ((call, principal) for call, principal in rows)
            if len(rows) < BATCH:
                return
            last = rows[-1][0]
            assert last.decided_at is not None
            after = (last.decided_at, last.id)

    def recent(
        self, principals: Sequence[str] | None, limit: int
    ) -> list[tuple[ToolCall, str]]:
        """The `limit` latest decided calls of `principals` (None: of every principal), the
        latest first: the approvals inbox's history."""
        query = (
            select(ToolCall, Execution.principal_id)
            .join(Execution, col(Execution.id) == col(ToolCall.execution_id))
            .where(col(ToolCall.decided_at).is_not(None))
        )
        if principals is not None:
            query = query.where(col(Execution.principal_id).in_(list(principals)))
        query = query.order_by(col(ToolCall.decided_at).desc(), col(ToolCall.id).desc()).limit(
            limit
        )
        with self._session() as s:
            return [(call, principal) for call, principal in s.exec(query)]
