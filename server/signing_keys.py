"""The server's signing keys: what seals a 2026-07-28 client's `requestState` (the native
door's `input_required` retry) so that any instance, after any restart, opens it and nobody
else forges it.

The keys live outside the database: configured (`LOCKGATE_SIGNING_KEYS`, the same on every
instance: the first seals, every one opens, so a rotation puts the new key first), or on
SQLite a key file next to the database file, made on first start. PostgreSQL needs them
configured: there is no one box to keep a file on.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from lockgate.machine.db.connect import sqlite_file
from lockgate.machine.settings import MAKE_A_SIGNING_KEY, MIN_SIGNING_KEY_CHARS, Settings

log = logging.getLogger("lockgate.server")


class SigningKeysMissing(RuntimeError):
    """PostgreSQL without LOCKGATE_SIGNING_KEYS: there is no one box to keep a key file on."""

    def __init__(self) -> None:
        super().__init__(
            "LOCKGATE_SIGNING_KEYS is not set. On PostgreSQL several instances seal and open "
            "the same state (a client's input_required retry may reach any of them), so they "
            "must use the same key, kept outside the database. Set LOCKGATE_SIGNING_KEYS to "
            f"the same secret of at least {MIN_SIGNING_KEY_CHARS} characters on every "
            f"instance (make one with: {MAKE_A_SIGNING_KEY}), then start again."
        )


class SigningKeyFileInvalid(RuntimeError):
    """The SQLite default key file exists but cannot be used, or cannot be created."""


@dataclass(frozen=True)
class SigningKeys:
    """The server's signing keys: the first seals, every one opens (so a rotation puts the
    new key first and keeps the old one until what it sealed has expired)."""

    keys: tuple[bytes, ...] = field(repr=False)
    #: Where the keys come from, for the start-up log (never a key).
    origin: str

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("at least one signing key is needed")


def signing_keys(settings: Settings) -> SigningKeys:
    """The configured keys; unset, on SQLite the key file next to the database file (made
    on first start), on in-memory SQLite a key for this process only. On PostgreSQL the
    keys must be configured: every instance must sign with the same one."""
    configured = settings.signing_secrets
    if configured:
        return SigningKeys(
            configured,
            f"LOCKGATE_SIGNING_KEYS ({len(configured)} key(s); the first signs, all verify)",
        )
    if not settings.is_sqlite:
        raise SigningKeysMissing()
    database = sqlite_file(settings.database_url)
    if database is None:
        # Nothing outlives the process here, sealed state included.
        return SigningKeys(
            (secrets.token_bytes(32),),
            "a key of this process only (in-memory database, LOCKGATE_SIGNING_KEYS unset)",
        )
    path = database.with_name(database.name + ".key").absolute()
    key, created = _key_file(path)
    return SigningKeys(
        (key,),
        f"the key file {path} ({'created now' if created else 'reused'}; "
        "LOCKGATE_SIGNING_KEYS unset). Keep it out of database backups: with it, a copy of "
        "the database opens the state sealed for clients' retries",
    )


def _key_file(path: Path) -> tuple[bytes, bool]:
    """The key in `path`, and whether it was created now. A new file is written in full
    under another name and then linked into place, which fails if it exists: of servers
    starting at once on one database, one creates it and all use that one, and no reader
    ever sees a half-written key."""
    try:
        return _read_key_file(path), False
    except FileNotFoundError:
        pass
    spare = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    created = True
    try:
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(spare, path)
        except FileExistsError:
            created = False
        _sync_directory(path.parent)
    except OSError as exc:
        raise SigningKeyFileInvalid(
            f"Could not create the signing key file {path}: {exc.strerror}. "
            "Make its directory writable, or set LOCKGATE_SIGNING_KEYS."
        ) from None
    finally:
        spare.unlink(missing_ok=True)
    return _read_key_file(path), created


def _read_key_file(path: Path) -> bytes:
    try:
        with open(path, encoding="ascii") as source:
            mode = os.fstat(source.fileno()).st_mode
            key = source.read().strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not text"
        raise SigningKeyFileInvalid(
            f"Could not read the signing key file {path}: {reason}."
        ) from None
    if len(key) < MIN_SIGNING_KEY_CHARS:
        raise SigningKeyFileInvalid(
            f"The signing key file {path} holds no key (fewer than "
            f"{MIN_SIGNING_KEY_CHARS} characters). Delete it to have a new one made (the "
            "retries of clients' input_required answers then fail; they ask again)."
        )
    if stat.S_IMODE(mode) & 0o077:
        log.warning(
            "the signing key file %s can be read by other users; make it private: chmod 600 %s",
            path,
            path,
        )
    return key.encode()


def _sync_directory(directory: Path) -> None:
    """Make the new file's name durable: a key lost to a power cut would void what it sealed."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
