"""Reads of single tool-call journal rows, for the engine's drive and its decisions.

A call's id is `<execution id>:<seq>` (`machine.tools.registry.make_idempotency_key`), so
the call an execution waits on or replays is read by primary key; the latest or last decided
call of an execution is read through the index on `tool_calls.execution_id`, among that
execution's own calls only.
"""

from __future__ import annotations

from functools import cache

from pydantic import JsonValue
from sqlalchemy import Select, bindparam
from sqlalchemy import select as core_select
from sqlmodel import col, func, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import ToolCall


@cache
def _highest_seq() -> Select[int | None]:
    """Built once: read at the start of every drive, through Core (no ORM session)."""
    columns = ToolCall.__table__.c  # type: ignore[attr-defined]
    return core_select(func.max(columns.seq)).where(
        columns.execution_id == bindparam("execution_id")
    )


@cache
def _decided_of() -> Select[int, JsonValue]:
    columns = ToolCall.__table__.c  # type: ignore[attr-defined]
    return (
        core_select(columns.seq, columns.decision)
        .where(
            columns.execution_id == bindparam("execution_id"),
            columns.tool == bindparam("tool"),
            columns.decided_at.is_not(None),
        )
        .order_by(columns.seq)
    )


class ToolCallQueries(Queries):
    def get(self, call_id: str) -> ToolCall | None:
        """The call by id (primary key): the one a checkpoint names, or a replayed one."""
        return self._get(ToolCall, call_id)

    def journaled_through(self, execution_id: str) -> int:
        """The highest call number the execution's journal holds (0: none), read once as a
        drive begins: only that drive journals the execution's calls from then on, each
        with a higher number, so a call above it needs no lookup (index on
        `tool_calls.execution_id`)."""
        with self._reads.connect() as conn:
            (highest,) = conn.execute(_highest_seq(), {"execution_id": execution_id}).one()
        return int(highest or 0)

    def latest(self, execution_id: str) -> ToolCall | None:
        """The execution's latest call: a drain must not hand back an execution whose
        latest call is in flight (index on `tool_calls.execution_id`)."""
        with self._session() as s:
            return s.exec(
                select(ToolCall)
                .where(ToolCall.execution_id == execution_id)
                .order_by(col(ToolCall.seq).desc())
                .limit(1)
            ).first()

    def last_decided(self, execution_id: str) -> ToolCall | None:
        """The execution's latest call a person decided: a repeated decision is compared
        with it to answer with the same outcome (index on `tool_calls.execution_id`)."""
        with self._session() as s:
            return s.exec(
                select(ToolCall)
                .where(ToolCall.execution_id == execution_id, col(ToolCall.decided_at).is_not(None))
                .order_by(col(ToolCall.seq).desc())
                .limit(1)
            ).first()

    def decided_of(self, execution_id: str, tool: str) -> list[tuple[int, JsonValue]]:
        """The execution's decided calls of `tool`, in call order, with their decisions:
        which grant covers its next call (index on `tool_calls.execution_id`). Read at every
        call the policy pauses, so an execution's calls read it once each: two columns
        through Core, not whole rows through the ORM (which cost 60 µs a row, the largest
        part of an approved write's CPU at 100 calls)."""
        with self._reads.connect() as conn:
            rows = conn.execute(_decided_of(), {"execution_id": execution_id, "tool": tool})
            return [(seq, decision) for seq, decision in rows]
