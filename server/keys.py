"""Principals and their API keys. Keys are 256-bit random strings; only their sha256 is kept."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlmodel import col, select

from machine.db.schema import ApiKey, Principal
from machine.db.store import SqlStore
from machine.errors import ErrorCode, LockgateError

KEY_PREFIX = "lg_"
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class InvalidPrincipal(LockgateError):
    code = ErrorCode.INVALID_INPUT


class KeyNotFound(LockgateError):
    code = ErrorCode.NOT_FOUND


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedKey:
    id: str
    principal_id: str
    #: Shown once, never stored.
    secret: str


@dataclass(frozen=True)
class KeyIdentity:
    key_id: str
    principal_id: str


@dataclass(frozen=True)
class KeyInfo:
    id: str
    principal_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class ApiKeys:
    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def create(self, principal: str) -> IssuedKey:
        if not _PRINCIPAL.match(principal):
            raise InvalidPrincipal(
                f"{principal!r} is not a valid principal name: use letters, digits and "
                "_ . @ - (up to 64 characters)."
            )
        now = datetime.now(UTC)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(
            id=uuid.uuid4().hex[:12],
            principal_id=principal,
            key_hash=hash_key(secret),
            prefix=secret[:10],
            created_at=now,
        )
        with self.store.session() as s:
            if s.get(Principal, principal) is None:
                s.add(Principal(id=principal, name=principal, created_at=now))
                s.flush()
            s.add(key)
            s.commit()
        return IssuedKey(id=key.id, principal_id=principal, secret=secret)

    def list(self) -> list[KeyInfo]:
        with self.store.session() as s:
            rows = s.exec(select(ApiKey).order_by(col(ApiKey.created_at)))
            return [
                KeyInfo(r.id, r.principal_id, r.prefix, r.created_at, r.revoked_at) for r in rows
            ]

    def revoke(self, key_id: str) -> KeyInfo:
        with self.store.session() as s:
            row = s.get(ApiKey, key_id)
            if row is None:
                raise KeyNotFound(
                    f"No API key {key_id!r}.", hint="`lockgate keys list` shows the key ids."
                )
            if row.revoked_at is None:
                row.revoked_at = datetime.now(UTC)
                s.add(row)
                s.commit()
            return KeyInfo(row.id, row.principal_id, row.prefix, row.created_at, row.revoked_at)

    def any_active(self) -> bool:
        with self.store.session() as s:
            return (
                s.exec(select(ApiKey.id).where(col(ApiKey.revoked_at).is_(None)).limit(1)).first()
                is not None
            )

    def identify(self, presented: str) -> KeyIdentity | None:
        """The key and principal a presented key is, or None (unknown or revoked)."""
        if not presented.startswith(KEY_PREFIX):
            return None
        with self.store.session() as s:
            row = s.exec(select(ApiKey).where(ApiKey.key_hash == hash_key(presented))).first()
        if row is None or row.revoked_at is not None:
            return None
        return KeyIdentity(row.id, row.principal_id)

    def authenticate(self, presented: str) -> str | None:
        """The principal a key belongs to, or None (unknown or revoked)."""
        identity = self.identify(presented)
        return identity.principal_id if identity is not None else None

    def has_active_key(self, principal_id: str) -> bool:
        with self.store.session() as s:
            found = s.exec(
                select(ApiKey.id)
                .where(ApiKey.principal_id == principal_id, col(ApiKey.revoked_at).is_(None))
                .limit(1)
            ).first()
        return found is not None

    def is_active(self, key_id: str) -> bool:
        """Whether the key exists and is not revoked (approval links die with their key)."""
        with self.store.session() as s:
            row = s.get(ApiKey, key_id)
        return row is not None and row.revoked_at is None
