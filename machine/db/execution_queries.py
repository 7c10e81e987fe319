"""Reads of executions and their tool-call journal (for the engine, recovery and the ledger).

Every read of live work goes through the live partial index (`live_executions()`), whose
statuses are rendered as literals so that SQLite, too, plans the query on it: the cost of
these reads grows with live work, never with history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import NamedTuple

from pydantic import JsonValue
from sqlalchemy import Connection, Select, and_, bindparam, case, or_, text
from sqlalchemy import select as core_select
from sqlmodel import col, func, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.queries import Queries, by_key, first, models, rows
from lockgate.machine.db.schema import Execution, ToolCall, live_executions
from lockgate.spec import ExecutionStatus as E


class CallLine(NamedTuple):
    """One journaled call as a view shows it."""

    seq: int
    tool: str
    status: str
    #: Only for the call the execution is paused on: None for every other.
    arguments_preview: JsonValue
    #: What its tool asked its user and the answers so far, for the call paused on only.
    input: JsonValue = None


class TaskLine(NamedTuple):
    """One execution as a listing of tasks shows it."""

    id: str
    status: str
    created_at: datetime
    updated_at: datetime


# The reads every maintenance round and every worker poll ask, built once.
@cache
def _running() -> SelectOfScalar[Execution]:
    return select(Execution).where(live_executions(), Execution.status == E.RUNNING)


@cache
def _by_origin() -> SelectOfScalar[Execution]:
    return select(Execution).where(Execution.origin_request == bindparam("origin_request"))


@cache
def _by_idempotency_key() -> SelectOfScalar[Execution]:
    return select(Execution).where(
        Execution.principal_id == bindparam("principal_id"),
        Execution.idempotency_key == bindparam("key"),
    )


@cache
def _pending_ids() -> SelectOfScalar[str]:
    return (
        select(Execution.id)
        .where(live_executions(), Execution.status == E.PENDING)
        .order_by(col(Execution.created_at))
        .limit(bindparam("limit"))
    )


@cache
def _paused_due() -> SelectOfScalar[Execution]:
    return select(Execution).where(
        live_executions(),
        Execution.status == E.WAITING_FOR_INTERACTION,
        col(Execution.deadline) <= bindparam("now"),
    )


@cache
def _call_lines() -> Select[int, str, str, JsonValue, JsonValue]:
    """Built once (the first view), not at import: a statement per view would be compiled
    again each time (SQLAlchemy caches by the statement's shape, but building it costs)."""
    columns = ToolCall.__table__.c  # type: ignore[attr-defined]
    paused_on = columns.seq == bindparam("paused_on")
    preview = case((paused_on, columns.arguments_preview), else_=None).label("arguments_preview")
    asked = case((paused_on, columns.input), else_=None).label("input")
    return (
        core_select(columns.seq, columns.tool, columns.status, preview, asked)
        .where(columns.execution_id == bindparam("execution_id"))
        .order_by(columns.seq)
    )


@cache
def _paused_count() -> Select[int]:
    """Built once: read at every `execute` (the admission limit), through Core."""
    columns = Execution.__table__.c  # type: ignore[attr-defined]
    return (
        core_select(func.count())
        .select_from(Execution.__table__)  # type: ignore[attr-defined]
        .where(
            live_executions(),
            columns.status == E.WAITING_FOR_INTERACTION,
            columns.principal_id == bindparam("principal_id"),
        )
    )


@cache
def _live_count() -> Select[int]:
    """Built once: a principal's unfinished executions (live index)."""
    columns = Execution.__table__.c  # type: ignore[attr-defined]
    return (
        core_select(func.count())
        .select_from(Execution.__table__)  # type: ignore[attr-defined]
        .where(live_executions(), columns.principal_id == bindparam("principal_id"))
    )


@dataclass(frozen=True)
class LiveUnder:
    """Admit a new execution of `principal_id` only while fewer than `limit` of its
    executions are unfinished (any of them may pause): counted in the transaction that
    inserts it, so concurrent `execute`s cannot overshoot (`StoreWrite`). SQLite has one
    writer at a time; on PostgreSQL a lock per principal, held to the commit, orders them.
    `refused` is what to raise at the limit."""

    principal_id: str
    limit: int
    refused: Callable[[], Exception]

    def write(self, conn: Connection) -> None:
        if conn.dialect.name == "postgresql":
            conn.execute(
                text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                {"key": f"lockgate:live:{self.principal_id}"},
            )
        [(count,)] = rows(conn, _live_count(), {"principal_id": self.principal_id})
        if int(count) >= self.limit:
            raise self.refused()


class ExecutionQueries(Queries):
    def get(self, execution_id: str) -> Execution | None:
        """The execution by id (primary key), in any state."""
        return self._get(Execution, execution_id)

    def with_calls(self, execution_id: str) -> tuple[Execution, list[CallLine]] | None:
        """The execution and a line per journaled call, read in one transaction, so a view
        never pairs a row with calls from another moment (primary key; index on
        `tool_calls.execution_id`). None when there is no such execution.

        A line carries only what a view shows (not the call's arguments or result, which
        would be decoded for every call an execution ever made, at every view of it); the
        arguments' preview only for the call the execution is paused on."""
        # Ended by a COMMIT, not the pool's ROLLBACK: psycopg forgets every statement it
        # prepared on the connection at a rollback (and has the server deallocate them), so
        # a view at every execution's end kept the commits' statements from ever staying
        # prepared. For a transaction that wrote nothing, the two are the same.
        with self._snapshots.begin() as conn:
            row = first(models(conn, Execution, by_key(Execution), {"key": execution_id}))
            if row is None:
                return None
            paused_on = row.snapshot_call if row.status == E.WAITING_FOR_INTERACTION else None
            lines = [
                CallLine(seq, tool, status, preview, asked)
                for seq, tool, status, preview, asked in rows(
                    conn, _call_lines(), {"execution_id": execution_id, "paused_on": paused_on}
                )
            ]
        return row, lines

    def by_origin(self, origin_request: str) -> Execution | None:
        """The execution a request started (`<session id>:<JSON-RPC id>`), if it started
        one: what a lost answer to that request reports (index on `origin_request`)."""
        return first(self._models(Execution, _by_origin(), {"origin_request": origin_request}))

    def by_idempotency_key(self, principal_id: str, key: str) -> Execution | None:
        """The principal's execution started with this client idempotency key, if any
        (the unique index `ux_executions_idempotency_key` serves it)."""
        return first(
            self._models(
                Execution, _by_idempotency_key(), {"principal_id": principal_id, "key": key}
            )
        )

    def running(self) -> list[Execution]:
        """Every running execution, of any owner: recovery keeps those whose owner holds no
        lease (read through the live index, `ix_executions_live`)."""
        return self._models(Execution, _running())

    def pending_ids(self, limit: int) -> list[str]:
        """The oldest pending executions (new, or requeued by recovery), for an instance to
        claim: read through the live index, so the queue costs what is queued."""
        with self._session() as s:
            return list(s.exec(_pending_ids(), params={"limit": limit}))

    def paused_due(self, now: datetime) -> list[Execution]:
        """Paused executions whose approval deadline passed by `now`: the expiry sweep's
        work (live index; the deadline is filtered among the paused rows only)."""
        return self._models(Execution, _paused_due(), {"now": now})

    def live_statuses(
        self, *, session_id: str | None = None, principal_id: str | None = None
    ) -> list[str]:
        """The status of every live execution, optionally of one session or principal: the
        session lease counts running and paused work from them (live index)."""
        with self._session() as s:
            query = select(Execution.status).where(live_executions())
            if session_id is not None:
                query = query.where(Execution.session_id == session_id)
            if principal_id is not None:
                query = query.where(Execution.principal_id == principal_id)
            return list(s.exec(query))

    def paused_count(self, principal_id: str) -> int:
        """How many of the principal's executions wait for a decision, on every instance:
        the `max_paused_per_principal` admission limit (live index)."""
        with self._reads.connect() as conn:
            (count,) = conn.execute(_paused_count(), {"principal_id": principal_id}).one()
        return int(count)

    def page_of(
        self, principal_id: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[TaskLine]:
        """The principal's executions, newest first, `limit` of them after `after` (the
        creation time and id of the last one of the page before): what a task listing
        shows of each, never its blobs (index `ix_executions_principal`)."""
        query = select(
            Execution.id, Execution.status, Execution.created_at, Execution.updated_at
        ).where(Execution.principal_id == principal_id)
        if after is not None:
            created, execution_id = after
            query = query.where(
                or_(
                    col(Execution.created_at) < created,
                    and_(col(Execution.created_at) == created, col(Execution.id) < execution_id),
                )
            )
        query = query.order_by(col(Execution.created_at).desc(), col(Execution.id).desc())
        with self._session() as s:
            return [TaskLine(*line) for line in s.exec(query.limit(limit))]

    def calls(self, execution_id: str) -> list[ToolCall]:
        """The execution's journal, in call order (the latest call last): what recovery
        decides on and records in `what_ran` (index on `tool_calls.execution_id`)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(ToolCall)
                    .where(ToolCall.execution_id == execution_id)
                    .order_by(col(ToolCall.seq))
                )
            )
