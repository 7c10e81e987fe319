"""Principals and their API keys (for server/keys.py): reads, and their own writes.

Keys are credentials, not lifecycle records: they have no status machine, so their inserts
and revocations are plain transactions of their own here, not `SqlStore.commit`s. Only a
key's sha256 is stored; looking a presented key up goes by that hash (unique index).
"""

from __future__ import annotations

from datetime import datetime
from functools import cache

from sqlalchemy import bindparam
from sqlmodel import col, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.queries import Queries, first
from lockgate.machine.db.schema import ApiKey, Principal


@cache
def _by_hash() -> SelectOfScalar[ApiKey]:
    """Built once: every request is identified by it."""
    return select(ApiKey).where(ApiKey.key_hash == bindparam("key_hash"))


class KeyQueries(Queries):
    def add(self, key: ApiKey, principal: Principal) -> None:
        """Insert `key`, and its principal first unless one with that id exists, in one
        transaction: a key is never stored without its principal."""
        with self._writing() as s:
            if s.get(Principal, principal.id) is None:
                s.add(principal)
                s.flush()
            s.add(key)

    def all(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first (the operator's listing)."""
        with self._session() as s:
            return list(s.exec(select(ApiKey).order_by(col(ApiKey.created_at))))

    def get(self, key_id: str) -> ApiKey | None:
        """The key by id (primary key), revoked or not."""
        return self._get(ApiKey, key_id)

    def by_hash(self, key_hash: str) -> ApiKey | None:
        """The key whose sha256 is `key_hash`, revoked or not (unique index on
        `key_hash`): how a presented key is identified."""
        return first(self._models(ApiKey, _by_hash(), {"key_hash": key_hash}))

    def revoke(self, key_id: str, at: datetime) -> ApiKey | None:
        """Mark the key revoked at `at`, unless it already was (its first revocation time
        is kept); returns the key as stored, or None when there is no such key."""
        with self._writing() as s:
            row = s.get(ApiKey, key_id)
            if row is not None and row.revoked_at is None:
                row.revoked_at = at
                s.add(row)
        return row

    def any_active(self) -> bool:
        """Whether any key at all is unrevoked: a server with none cannot be used, and says
        so on start (stops at the first row found)."""
        with self._session() as s:
            found = s.exec(select(ApiKey.id).where(col(ApiKey.revoked_at).is_(None)).limit(1))
            return found.first() is not None

    def principal_has_active(self, principal_id: str) -> bool:
        """Whether the principal holds an unrevoked key: a link minted outside a keyed
        request lives while it does (index on `api_keys.principal_id`)."""
        with self._session() as s:
            found = s.exec(
                select(ApiKey.id)
                .where(ApiKey.principal_id == principal_id, col(ApiKey.revoked_at).is_(None))
                .limit(1)
            ).first()
        return found is not None
