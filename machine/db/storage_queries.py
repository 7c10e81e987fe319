"""The SQL of what executions keep: growing an execution's `stored_bytes` with the bytes a
transaction writes for it, summing a principal's from an index, and purging the oldest
finished executions whole (`machine/storage.py` decides what counts and when)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, Update, bindparam, delete, func, select, text, update
from sqlalchemy.sql.elements import ColumnElement

from lockgate.machine.db.queries import Queries, rows
from lockgate.machine.db.schema import (
    Execution,
    ToolCall,
    TransitionLog,
    WebhookDelivery,
    finished_executions,
)
from lockgate.spec import WEBHOOK_DELIVERY

_EXECUTIONS = Execution.__table__  # type: ignore[attr-defined]
_CALLS = ToolCall.__table__  # type: ignore[attr-defined]
_LOG = TransitionLog.__table__  # type: ignore[attr-defined]
_WEBHOOKS = WebhookDelivery.__table__  # type: ignore[attr-defined]
_WEBHOOKS_DONE = tuple(s.name for s in WEBHOOK_DELIVERY.states if s.terminal)
#: Ids per IN list (well under either database's bound on bound parameters).
_CHUNK = 500


@cache
def _finished_before() -> Select[Any, Any]:
    """The oldest finished executions last moved before `:before`, `:limit` of them."""
    return (
        select(_EXECUTIONS.c.id, _EXECUTIONS.c.calls_made)
        .where(finished_executions(), _EXECUTIONS.c.updated_at < bindparam("before"))
        .order_by(_EXECUTIONS.c.updated_at)
        .limit(bindparam("limit"))
    )


@cache
def _grow() -> Update:
    return (
        update(_EXECUTIONS)
        .where(_EXECUTIONS.c.id == bindparam("w_id"))
        .values(stored_bytes=_EXECUTIONS.c.stored_bytes + bindparam("w_bytes"))
    )


@cache
def _principal_bytes() -> Select[Any]:
    """A principal's executions' bytes, summed over `ix_executions_principal_bytes` alone."""
    return select(func.coalesce(func.sum(_EXECUTIONS.c.stored_bytes), 0)).where(
        _EXECUTIONS.c.principal_id == bindparam("principal_id")
    )


@dataclass(frozen=True)
class Grow:
    """Add bytes to executions' `stored_bytes` in the transaction that writes them
    (`StoreWrite`)."""

    by_execution: tuple[tuple[str, int], ...]

    def write(self, conn: Connection) -> None:
        conn.execute(_grow(), [{"w_id": eid, "w_bytes": n} for eid, n in self.by_execution])


@dataclass(frozen=True)
class StoredUnder:
    """Admit a new execution of `principal_id` only while its executions keep fewer than
    `limit` bytes, summed in the transaction that inserts it (`StoreWrite`; on PostgreSQL
    under the per-principal lock the unfinished-executions cap takes). `refused(stored)` is
    what to raise at the limit."""

    principal_id: str
    limit: int
    refused: Callable[[int], Exception]

    def write(self, conn: Connection) -> None:
        if conn.dialect.name == "postgresql":
            conn.execute(
                text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                {"key": f"lockgate:live:{self.principal_id}"},
            )
        principal = {"principal_id": self.principal_id}
        [(stored,)] = rows(conn, _principal_bytes(), principal)
        if int(stored) >= self.limit:
            raise self.refused(int(stored))


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)]


class StorageQueries(Queries):
    def stored_bytes(self, principal_id: str) -> int:
        """The bytes `principal_id`'s executions keep."""
        with self._session() as s:
            return int(s.execute(_principal_bytes(), {"principal_id": principal_id}).scalar_one())

    def purge_finished(self, before: datetime, max_calls: int) -> tuple[int, int]:
        """Delete the oldest executions that finished before `before`, whole: their calls,
        their transitions and their settled webhook events, in one transaction. Whole
        executions are taken, oldest first, until their calls reach `max_calls` (the first
        one is always taken), so the round's work is bounded. Returns (executions, calls).

        Whether any is due is read first, taking no lock: every maintenance round asks, and
        mostly none is (the write lock was taken, on SQLite from every instance on the
        file, for nothing)."""
        due_now = {"before": before, "limit": max(1, max_calls // 10)}
        with self._session() as s:
            if s.execute(_finished_before(), due_now).first() is None:
                return 0, 0
        with self._writing() as s:
            taken: list[str] = []
            calls = 0
            for execution_id, made in s.execute(_finished_before(), due_now):
                if taken and calls + made > max_calls:
                    break
                taken.append(execution_id)
                calls += made
            if not taken:
                return 0, 0
            deleted_calls = 0
            for ids in _chunks(taken):
                call_ids = list(
                    s.execute(select(_CALLS.c.id).where(_CALLS.c.execution_id.in_(ids))).scalars()
                )
                for records in _chunks([*ids, *call_ids]):
                    s.execute(delete(_LOG).where(_LOG.c.record_id.in_(records)))
                s.execute(delete(_CALLS).where(_CALLS.c.execution_id.in_(ids)))
                deleted_calls += len(call_ids)
                s.execute(
                    delete(_WEBHOOKS).where(
                        _WEBHOOKS.c.execution_id.in_(ids), _WEBHOOKS.c.status.in_(_WEBHOOKS_DONE)
                    )
                )
                # Finished ones only: a terminal status never changes, so none taken above
                # has come back to life meanwhile; the condition says so to the database.
                finished: ColumnElement[bool] = finished_executions()
                s.execute(delete(_EXECUTIONS).where(_EXECUTIONS.c.id.in_(ids), finished))
            return len(taken), deleted_calls
