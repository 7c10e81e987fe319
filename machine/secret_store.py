"""The secret store: credentials kept in the database, encrypted at rest.

Values are Fernet tokens (the `cryptography` library: AES-128-CBC with an HMAC-SHA256) under
the operator's LOCKGATE_SECRETS_KEY, a comma-separated list of keys of which the first
encrypts and every one decrypts: to rotate, put a new key first, run `lockgate secrets
rotate` (every value re-encrypted under it), then drop the old one. The key never enters the
database, so a copy of the database alone opens nothing.

A secret is global or one principal's (a principal's own shadows a global one of the same
name), and usable by any source's tools or bound to one source: a secret bound to `github`
never reaches a tool of another source, even one that names it. Values are decrypted only
at dispatch, after any approval (`Dispatcher._invoke`), and scrubbed from all it returns.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from lockgate.machine.db.schema import StoredSecret
from lockgate.machine.db.secret_queries import SecretQueries
from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.secrets import OWN_ONLY_HINT, EnvironmentSecrets, MissingSecret, SecretStore
from lockgate.machine.settings import Settings

KEY_SETTING = "LOCKGATE_SECRETS_KEY"


class SecretKeyProblem(LockgateError):
    """LOCKGATE_SECRETS_KEY is missing while secrets are stored, or cannot be used."""

    code = ErrorCode.INVALID_INPUT


def new_key() -> str:
    """A fresh key for LOCKGATE_SECRETS_KEY."""
    return Fernet.generate_key().decode()


class SecretCipher:
    def __init__(self, keys: Sequence[str]) -> None:
        fernets: list[Fernet] = []
        for n, key in enumerate(keys, start=1):
            try:
                fernets.append(Fernet(key.strip().encode()))
            except (ValueError, TypeError):
                raise SecretKeyProblem(
                    f"entry {n} of {KEY_SETTING} is not a key (32 url-safe base64-encoded bytes)",
                    hint="Make one with `lockgate secrets key`.",
                ) from None
        if not fernets:
            raise SecretKeyProblem(
                f"{KEY_SETTING} is empty", hint="Make a key with `lockgate secrets key`."
            )
        self._fernet = MultiFernet(fernets)

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretCipher | None:
        """The cipher of LOCKGATE_SECRETS_KEY, or None when it is not set."""
        text = settings.secrets_key.get_secret_value() if settings.secrets_key else ""
        keys = [k for k in text.split(",") if k.strip()]
        return cls(keys) if keys else None

    def encrypt(self, value: str) -> bytes:
        return self._fernet.encrypt(value.encode())

    def decrypt(self, token: bytes, name: str) -> str:
        try:
            return self._fernet.decrypt(token).decode()
        except InvalidToken:
            raise _undecryptable(name, "or set it again") from None

    def rotate(self, token: bytes, name: str) -> bytes:
        try:
            return self._fernet.rotate(token)
        except InvalidToken:
            raise _undecryptable(name, "then rotate again") from None

    def __repr__(self) -> str:  # never the keys
        return "SecretCipher(...)"


class InvalidSecret(LockgateError):
    """A secret's name, value or source binding the store cannot keep."""

    code = ErrorCode.INVALID_INPUT


#: The names sources give their secrets (`auth = { bearer = "<name>" }`).
_SECRET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
#: The largest value stored: credentials are far smaller; a file pasted by mistake is not.
MAX_SECRET_BYTES = 64 * 1024


def _check_secret(name: str, value: str, source: str | None) -> None:
    if not _SECRET_NAME.fullmatch(name):
        raise InvalidSecret(
            f"{name[:60]!r} is not a secret name: use letters, digits and _ . - "
            "(up to 200 characters), as the source's auth names it"
        )
    if not value:
        raise InvalidSecret(f"the value of secret {name!r} is empty")
    if len(value.encode()) > MAX_SECRET_BYTES:
        raise InvalidSecret(
            f"the value of secret {name!r} is over {MAX_SECRET_BYTES} bytes: a credential "
            "is far smaller (was a file given by mistake?)"
        )
    if source is not None and not (source.isidentifier() and len(source) <= 200):
        raise InvalidSecret(
            f"{source[:60]!r} is not a source name (a Python identifier, as agent code "
            "calls tools.<source>)"
        )


def _undecryptable(name: str, then: str) -> SecretKeyProblem:
    return SecretKeyProblem(
        f"secret {name!r} cannot be decrypted with any key of {KEY_SETTING}",
        hint=f"Put back the key it was stored under (first or not), {then}.",
    )


@dataclass(frozen=True)
class SecretEntry:
    """What a listing shows of a secret: never its value."""

    name: str
    principal_id: str | None
    source: str | None
    updated_at: datetime


class StoredSecrets:
    """A `SecretStore` over the database, the operator's environment variables behind it
    (a name stored nowhere is looked up there, as before the store existed)."""

    def __init__(
        self,
        queries: SecretQueries,
        cipher: SecretCipher | None,
        fallback: SecretStore | None = None,
    ) -> None:
        self.queries, self.cipher = queries, cipher
        self.fallback = fallback if fallback is not None else EnvironmentSecrets()

    def resolve(
        self,
        names: Sequence[str],
        *,
        principal: str | None = None,
        source: str | None = None,
        own_only: bool = False,
    ) -> dict[str, str]:
        found: dict[str, str] = {}
        bound_elsewhere: list[str] = []
        rows = self.queries.named(names, principal)
        if own_only:  # a principal's own source: its principal's rows, and nothing else
            rows = [row for row in rows if principal is not None and row.principal_id == principal]
        # A principal's own secret shadows the global one of the same name.
        chosen = {row.name: row for row in sorted(rows, key=lambda r: r.principal_id is not None)}
        for name, row in chosen.items():
            if row.source is not None and row.source != source:
                bound_elsewhere.append(name)
                continue
            if self.cipher is None:
                raise SecretKeyProblem(
                    f"secret {name!r} is stored but {KEY_SETTING} is not set",
                    hint=f"Set {KEY_SETTING} to the key the secrets were stored under.",
                )
            found[name] = self.cipher.decrypt(row.ciphertext, name)
        rest = [n for n in names if n not in found and n not in bound_elsewhere]
        missing = list(bound_elsewhere)
        if own_only:
            missing += rest
            rest = []
        if rest:
            try:
                found.update(self.fallback.resolve(rest, principal=principal, source=source))
            except MissingSecret as exc:
                missing += exc.names
        if missing:
            raise MissingSecret(
                missing,
                hint=OWN_ONLY_HINT
                if own_only
                else "Store it with `lockgate secrets set <name>` (for this principal or "
                "everyone, and for this tool's source or any).",
            )
        return found

    # -- the operator's commands -------------------------------------------------------------

    def set(
        self, name: str, value: str, *, principal: str | None = None, source: str | None = None
    ) -> bool:
        """Store (or replace) a secret; True when it is new."""
        if self.cipher is None:
            raise SecretKeyProblem(
                f"{KEY_SETTING} is not set: a secret cannot be stored unencrypted",
                hint=f"Make a key with `lockgate secrets key` and set {KEY_SETTING} on every "
                "instance.",
            )
        _check_secret(name, value, source)
        now = datetime.now(UTC)
        return self.queries.put(
            StoredSecret(
                id=uuid.uuid4().hex,
                principal_id=principal,
                name=name,
                source=source,
                ciphertext=self.cipher.encrypt(value),
                created_at=now,
                updated_at=now,
            )
        )

    def listed(self) -> list[SecretEntry]:
        return [
            SecretEntry(r.name, r.principal_id, r.source, r.updated_at) for r in self.queries.all()
        ]

    def delete(self, name: str, *, principal: str | None = None) -> bool:
        return self.queries.delete(name, principal)

    def rotate(self) -> int:
        """Re-encrypt every value under the first key; the count re-encrypted."""
        if self.cipher is None:
            raise SecretKeyProblem(f"{KEY_SETTING} is not set", hint="Nothing can be rotated.")
        rows = self.queries.all()
        for row in rows:
            row.ciphertext = self.cipher.rotate(row.ciphertext, row.name)
        self.queries.replace_all(rows)
        return len(rows)

    def check_startable(self) -> None:
        """SecretKeyProblem when secrets are stored and no key is set: a server that could
        not use them must not start and fail every call that needs one."""
        if self.cipher is None and self.queries.any():
            raise SecretKeyProblem(
                f"secrets are stored in the database but {KEY_SETTING} is not set",
                hint=f"Set {KEY_SETTING} to the key they were stored under.",
            )

    def __repr__(self) -> str:
        return "StoredSecrets(...)"


__all__ = [
    "KEY_SETTING",
    "MAX_SECRET_BYTES",
    "InvalidSecret",
    "SecretCipher",
    "SecretEntry",
    "SecretKeyProblem",
    "StoredSecrets",
    "new_key",
]
