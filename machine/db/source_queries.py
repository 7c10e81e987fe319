"""Stored tool sources (for machine/source_book.py, machine/source_catalog.py and
`lockgate sources`): reads, and their own writes.

Sources are configuration, not lifecycle records: an add or a removal is a plain
transaction of its own here, not a `SqlStore.commit`.
"""

from __future__ import annotations

from sqlalchemy import func, text
from sqlmodel import col, select

from lockgate.machine.db.queries import Queries, applies_to, same_value
from lockgate.machine.db.schema import StoredSource


class SourceQueries(Queries):
    def add(self, row: StoredSource, *, most: int | None = None) -> StoredSource | str:
        """Store `row`; or, without writing anything, the stored source of the same name and
        principal (its caller compares them), or "full" when the principal already holds
        `most` sources. Checked and written in one transaction under the writer's lock."""
        with self._writing() as s:
            if s.connection().dialect.name == "postgresql":
                # Two adds at once count in turn (SQLite has one writer at a time already).
                s.connection().execute(
                    text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                    {"key": f"lockgate:sources:{row.principal_id}"},
                )
            same = s.exec(
                select(StoredSource).where(
                    same_value(col(StoredSource.principal_id), row.principal_id),
                    StoredSource.name == row.name,
                )
            ).first()
            if same is not None:
                return same
            if most is not None:
                held = s.exec(
                    select(func.count()).where(
                        same_value(col(StoredSource.principal_id), row.principal_id)
                    )
                ).one()
                if held >= most:
                    return "full"
            s.add(row)
        return row

    def remove(self, principal_id: str | None, name: str) -> StoredSource | None:
        """Delete `principal_id`'s source `name` (None: the global one); returns it as it
        was, or None when there is no such source."""
        with self._writing() as s:
            row = s.exec(
                select(StoredSource).where(
                    same_value(col(StoredSource.principal_id), principal_id),
                    StoredSource.name == name,
                )
            ).first()
            if row is not None:
                s.delete(row)
        return row

    def all(self) -> list[StoredSource]:
        """Every stored source, global ones first, then by principal, by name."""
        with self._session() as s:
            return list(
                s.exec(
                    select(StoredSource).order_by(
                        col(StoredSource.principal_id).is_not(None),
                        col(StoredSource.principal_id),
                        col(StoredSource.name),
                    )
                )
            )

    def applying_to(self, principal_id: str | None) -> list[StoredSource]:
        """The global sources and `principal_id`'s own, oldest first."""
        with self._session() as s:
            return list(
                s.exec(
                    select(StoredSource)
                    .where(applies_to(col(StoredSource.principal_id), principal_id))
                    .order_by(col(StoredSource.created_at), col(StoredSource.id))
                )
            )

    def ids_applying_to(self, principal_id: str | None) -> tuple[str, ...]:
        """The ids of `applying_to(principal_id)`, without their (large) configs: what a
        cache compares to know whether what it built is still current."""
        with self._session() as s:
            return tuple(
                s.exec(
                    select(StoredSource.id)
                    .where(applies_to(col(StoredSource.principal_id), principal_id))
                    .order_by(col(StoredSource.created_at), col(StoredSource.id))
                )
            )

    def get(self, source_id: str) -> StoredSource | None:
        """One stored source with its config (to build it), or None once removed."""
        return self._get(StoredSource, source_id)
