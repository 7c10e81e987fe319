"""What the engine answers without changing anything: an execution's view, and counts of live
work for the session lease and the admission limits. Reads only, through the store's typed
queries (the counts through the live partial index, so they cost what is live).
"""

from __future__ import annotations

from lockgate.machine.db.execution_queries import TaskLine
from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore
from lockgate.machine.execution_errors import ExecutionNotFound, IdempotencyKeyReused
from lockgate.machine.views import ExecutionView, build_view
from lockgate.spec import ExecutionStatus as E


class AlreadyStarted(Exception):
    """The idempotency key a call names already started this execution: wait for it (see
    `Engine.begin`)."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(execution_id)
        self.execution_id = execution_id


class ExecutionReads:
    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def view(self, execution_id: str) -> ExecutionView:
        found = self.store.executions.with_calls(execution_id)
        if found is None:
            raise ExecutionNotFound(execution_id=execution_id)
        return build_view(*found)

    def owned(self, execution_id: str, principal_id: str) -> Execution:
        row = self.store.executions.get(execution_id)
        if row is None or row.principal_id != principal_id:
            # Another principal's execution is answered exactly like a missing one: the
            # answer must not tell whether someone else's execution exists.
            raise ExecutionNotFound(execution_id=execution_id)
        return row

    def page(
        self, principal_id: str, limit: int, after: str | None = None
    ) -> tuple[list[TaskLine], str | None]:
        """The principal's executions, newest first, `limit` at most after the execution
        `after` (another principal's, or none: ExecutionNotFound); and the id to ask the
        next page after, if there may be one."""
        since = None
        if after is not None:
            last = self.owned(after, principal_id)
            since = (last.created_at, last.id)
        lines = self.store.executions.page_of(principal_id, limit + 1, since)
        more = len(lines) > limit
        return lines[:limit], (lines[limit - 1].id if more else None)

    def live_counts(
        self, *, session_id: str | None = None, principal_id: str | None = None
    ) -> dict[str, int]:
        """Running (pending included) and paused executions, for the lease policy."""
        statuses = self.store.executions.live_statuses(
            session_id=session_id, principal_id=principal_id
        )
        paused = sum(1 for st in statuses if st == E.WAITING_FOR_INTERACTION)
        return {"running": len(statuses) - paused, "paused": paused}

    def paused_count(self, principal_id: str) -> int:
        """The principal's executions waiting for a decision, on every instance (for the
        `max_paused_per_principal` admission limit)."""
        return self.store.executions.paused_count(principal_id)

    def refuse_started(self, principal_id: str, code: str, key: str) -> None:
        """Raise `AlreadyStarted` (or `IdempotencyKeyReused`, for other code) when `key`
        already started an execution of the principal; return when it is free."""
        row = self.store.executions.by_idempotency_key(principal_id, key)
        if row is None:
            return
        if row.code != code:
            raise IdempotencyKeyReused(execution_id=row.id)
        raise AlreadyStarted(row.id)
