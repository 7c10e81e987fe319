"""Reads of instance rows: incarnation numbers and heartbeat leases (for machine/instances.py
and the session ledger's recovery).

The instances table holds one row per start of any instance, so it is small; every read here
is cheap, and none needs more than the indexes on `incarnation` (unique) and `status`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from sqlalchemy import bindparam
from sqlmodel import col, func, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import Instance
from lockgate.spec import InstanceStatus as I


# The maintenance round's reads, built once (every round asks them; a statement built anew
# cost more than SQLite's answer).
@cache
def _holding_lease() -> SelectOfScalar[str]:
    return select(Instance.id).where(
        col(Instance.status).in_([I.LIVE, I.DRAINING]), col(Instance.lease_until) > bindparam("now")
    )


@cache
def _alive_except() -> SelectOfScalar[Instance]:
    return select(Instance).where(
        col(Instance.status).in_([I.LIVE, I.DRAINING]), Instance.id != bindparam("instance_id")
    )


@dataclass(frozen=True)
class IncarnationLease:
    """What decides whether an incarnation still holds its lease."""

    incarnation: int
    status: str
    lease_until: datetime


class InstanceQueries(Queries):
    def get(self, instance_id: str) -> Instance | None:
        """The instance row by id (primary key), in any state: re-read when a transition of
        our own incarnation conflicts, to tell a racing thread of this process from a
        death declared by another instance."""
        return self._get(Instance, instance_id)

    def latest_incarnation(self) -> int | None:
        """The highest incarnation number taken so far (None on an empty table): a new
        start takes the next one (read on the unique index on `incarnation`)."""
        with self._session() as s:
            return s.exec(select(func.max(Instance.incarnation))).one()

    def holding_lease(self, now: datetime) -> set[str]:
        """Ids of the instances that are live or draining and whose lease still holds at
        `now`: their running executions are theirs, not recovery's."""
        with self._session() as s:
            return set(s.exec(_holding_lease(), params={"now": now}))

    def alive_except(self, instance_id: str) -> list[Instance]:
        """Every instance still recorded live or draining, but `instance_id` (ours): the
        candidates to declare dead once their lease lapses (index on `status`)."""
        with self._session() as s:
            return list(s.exec(_alive_except(), params={"instance_id": instance_id}))

    def leases_of(self, incarnations: Collection[int]) -> list[IncarnationLease]:
        """The status and lease of each of `incarnations` (those holding an unsettled entry
        or an active session, a handful): the session ledger tells from them which are dead
        (their sessions and debts are recovery's). Never every incarnation: each start of a
        server leaves one row for good (unique index on `incarnation`)."""
        with self._session() as s:
            rows = s.exec(
                select(Instance.incarnation, Instance.status, Instance.lease_until).where(
                    col(Instance.incarnation).in_(list(incarnations))
                )
            )
            return [IncarnationLease(inc, status, until) for inc, status, until in rows]
