"""Reads behind the operations endpoints (/metrics), taken at scrape time."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import func, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import Execution, live_executions


@dataclass(frozen=True)
class StatusCount:
    status: str
    count: int


class MetricsQueries(Queries):
    def live_executions_by_status(self) -> list[StatusCount]:
        """How many executions are in each live status (statuses with none are absent):
        the live-executions gauge. Grouped on the live partial index (`ix_executions_live`,
        statuses as literals), so a scrape costs what live work costs, not history."""
        with self._session() as s:
            rows = s.exec(
                select(Execution.status, func.count())
                .where(live_executions())
                .group_by(Execution.status)
            )
            return [StatusCount(status, count) for status, count in rows]
