"""Reads of executions and their tool-call journal (for recovery and the session ledger).

Every read of live work goes through the live partial index (`live_executions()`), whose
statuses are rendered as literals so that SQLite, too, plans the query on it: the cost of
these reads grows with live work, never with history.
"""

from __future__ import annotations

from sqlmodel import col, select

from machine.db.queries import Queries
from machine.db.schema import Execution, ToolCall, live_executions
from spec import ExecutionStatus as E


class ExecutionQueries(Queries):
    def get(self, execution_id: str) -> Execution | None:
        """The execution by id (primary key), in any state."""
        with self._session() as s:
            return s.get(Execution, execution_id)

    def by_origin(self, origin_request: str) -> Execution | None:
        """The execution a request started (`<session id>:<JSON-RPC id>`), if it started
        one: what a lost answer to that request reports (index on `origin_request`)."""
        with self._session() as s:
            return s.exec(
                select(Execution).where(Execution.origin_request == origin_request)
            ).first()

    def running(self) -> list[Execution]:
        """Every running execution, of any owner: recovery keeps those whose owner holds no
        lease (read through the live index, `ix_executions_live`)."""
        with self._session() as s:
            return list(
                s.exec(select(Execution).where(live_executions(), Execution.status == E.RUNNING))
            )

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
