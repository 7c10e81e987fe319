"""The secret store's rows (for machine/secret_store.py and `lockgate secrets`): encrypted
values only; reads, and their own writes.

Secrets are configuration, not lifecycle records: a set or a deletion is a plain
transaction of its own here, not a `SqlStore.commit`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session, col, select

from lockgate.machine.db.queries import Queries, applies_to, same_value
from lockgate.machine.db.schema import StoredSecret


def _in_scope(s: Session, name: str, principal_id: str | None) -> StoredSecret | None:
    """The secret of that name for exactly that scope (a principal's, or everyone's)."""
    scope = same_value(col(StoredSecret.principal_id), principal_id)
    return s.exec(select(StoredSecret).where(scope, StoredSecret.name == name)).first()


class SecretQueries(Queries):
    def put(self, row: StoredSecret) -> bool:
        """Store `row`, replacing the value (and binding) of the secret of that name and
        scope if there is one; True when it is new."""
        with self._writing() as s:
            same = _in_scope(s, row.name, row.principal_id)
            if same is None:
                s.add(row)
                return True
            same.ciphertext, same.source, same.updated_at = (
                row.ciphertext,
                row.source,
                row.updated_at,
            )
            s.add(same)
            return False

    def delete(self, name: str, principal_id: str | None) -> bool:
        """Delete the secret of that name and scope; False when there is none."""
        with self._writing() as s:
            row = _in_scope(s, name, principal_id)
            if row is None:
                return False
            s.delete(row)
            return True

    def all(self) -> list[StoredSecret]:
        """Every stored secret, global ones first, then by principal and name."""
        with self._session() as s:
            return list(
                s.exec(
                    select(StoredSecret).order_by(
                        col(StoredSecret.principal_id).is_not(None),
                        col(StoredSecret.principal_id),
                        col(StoredSecret.name),
                    )
                )
            )

    def named(self, names: Sequence[str], principal_id: str | None) -> list[StoredSecret]:
        """The global secrets of these names, and `principal_id`'s own (index on `name`)."""
        if not names:
            return []
        scope = applies_to(col(StoredSecret.principal_id), principal_id)
        with self._session() as s:
            return list(
                s.exec(select(StoredSecret).where(col(StoredSecret.name).in_(names), scope))
            )

    def any(self) -> bool:
        """Whether any secret is stored (stops at the first row)."""
        with self._session() as s:
            return s.exec(select(StoredSecret.id).limit(1)).first() is not None

    def replace_all(self, rows: Sequence[StoredSecret]) -> None:
        """Write back re-encrypted values (a key rotation), all in one transaction."""
        with self._writing() as s:
            for row in rows:
                stored = s.get(StoredSecret, row.id)
                if stored is not None:
                    stored.ciphertext = row.ciphertext
                    s.add(stored)
