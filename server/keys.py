"""Principals and their API keys. Keys are 256-bit random strings; only their sha256 is kept."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from lockgate.machine.db.schema import ApiKey, Principal
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import ErrorCode, LockgateError

KEY_PREFIX = "lg_"
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class InvalidPrincipal(LockgateError):
    code = ErrorCode.INVALID_INPUT


class KeyNotFound(LockgateError):
    code = ErrorCode.NOT_FOUND


def check_principal(principal: str) -> None:
    """InvalidPrincipal unless `principal` is a name a principal may have."""
    if not _PRINCIPAL.match(principal):
        raise InvalidPrincipal(
            f"{principal!r} is not a valid principal name: use letters, digits and "
            "_ . @ - (up to 64 characters)."
        )


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


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(row.id, row.principal_id, row.prefix, row.created_at, row.revoked_at)


class ApiKeys:
    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def create(self, principal: str) -> IssuedKey:
        check_principal(principal)
        now = datetime.now(UTC)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(
            id=uuid.uuid4().hex[:12],
            principal_id=principal,
            key_hash=hash_key(secret),
            prefix=secret[:10],
            created_at=now,
        )
        self.store.keys.add(key, Principal(id=principal, name=principal, created_at=now))
        return IssuedKey(id=key.id, principal_id=principal, secret=secret)

    def list(self) -> list[KeyInfo]:
        return [_info(row) for row in self.store.keys.all()]

    def revoke(self, key_id: str) -> KeyInfo:
        row = self.store.keys.revoke(key_id, datetime.now(UTC))
        if row is None:
            raise KeyNotFound(
                f"No API key {key_id!r}.", hint="`lockgate keys list` shows the key ids."
            )
        return _info(row)

    def any_active(self) -> bool:
        return self.store.keys.any_active()

    def identify(self, presented: str) -> KeyIdentity | None:
        """The key and principal a presented key is, or None (unknown or revoked)."""
        if not presented.startswith(KEY_PREFIX):
            return None
        row = self.store.keys.by_hash(hash_key(presented))
        if row is None or row.revoked_at is not None:
            return None
        return KeyIdentity(row.id, row.principal_id)

    def authenticate(self, presented: str) -> str | None:
        """The principal a key belongs to, or None (unknown or revoked)."""
        identity = self.identify(presented)
        return identity.principal_id if identity is not None else None

    def has_active_key(self, principal_id: str) -> bool:
        return self.store.keys.principal_has_active(principal_id)

    def is_active(self, key_id: str) -> bool:
        """Whether the key exists and is not revoked (approval links die with their key)."""
        row = self.store.keys.get(key_id)
        return row is not None and row.revoked_at is None
