"""Single-use approval links: what makes an approval URL unguessable and bound to one call.

A paused call has one link per API key: minted the first time an answer shows the call, and
the same link in every answer after that (`link`). What a person reading the page needs is
that every link they were given for the call is the same one, and that it works exactly as
long as the call can still be decided: until it is used, or until the call's deadline (the
expiry the page shows), measured on the runtime's clock like the deadline itself. Only a
link that can no longer decide (used, expired, or its key revoked) is replaced.

The database holds nothing that opens a link. A link's URL carries `<id>-<mac>`: the id names
its row, and the mac is an HMAC-SHA256, under a signing key kept outside the database
(`LinkKeys`), of the id and of everything the row binds (execution, call, principal, API
key, expiry). Any instance with the key recomputes the same URL from the row, which is how
every answer hands out the same link; someone who reads the database (a leaked backup, a
replica's user) learns ids, which open nothing, and cannot re-bind a row to another call
either (its mac would no longer match).

Every time here is the caller's `now`, from the runtime's clock: expiry follows the same
clock as the call's deadline. The rows are read and written through the store; a link is
used up only by the decision it carries, in that decision's transaction (`use`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lockgate.machine.db.approval_token_queries import UseApprovalToken
from lockgate.machine.db.connect import sqlite_file
from lockgate.machine.db.schema import ApprovalToken
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.settings import MAKE_A_SIGNING_KEY, MIN_SIGNING_KEY_CHARS, Settings
from lockgate.server.keys import ApiKeys

log = logging.getLogger("lockgate.approval")


class TokenRefused(LockgateError):
    """An approval link that cannot be used: `reason` is unknown, used, expired or revoked."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# -- the signing keys ---------------------------------------------------------------------------


class SigningKeysMissing(RuntimeError):
    """PostgreSQL without LOCKGATE_SIGNING_KEYS: there is no one box to keep a key file on."""

    def __init__(self) -> None:
        super().__init__(
            "LOCKGATE_SIGNING_KEYS is not set. On PostgreSQL several instances hand out and "
            "check the same approval links, so they must sign them with the same key, kept "
            "outside the database. Set LOCKGATE_SIGNING_KEYS to the same secret of at least "
            f"{MIN_SIGNING_KEY_CHARS} characters on every instance (make one with: "
            f"{MAKE_A_SIGNING_KEY}), then start again."
        )


class SigningKeyFileInvalid(RuntimeError):
    """The SQLite default key file exists but cannot be used, or cannot be created."""


@dataclass(frozen=True)
class LinkKeys:
    """The keys approval links are signed with: the first signs, every one verifies (so a
    rotation puts the new key first and keeps the old one until its links have expired)."""

    keys: tuple[bytes, ...] = field(repr=False)
    #: Where the keys come from, for the start-up log (never a key).
    origin: str

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("at least one signing key is needed")

    def sign(self, message: bytes) -> str:
        return _mac(self.keys[0], message)

    def verify(self, message: bytes, mac: str) -> bool:
        # Every key is tried, with a constant-time comparison, whichever matches.
        found = False
        for key in self.keys:
            found |= hmac.compare_digest(_mac(key, message), mac)
        return found


def _mac(key: bytes, message: bytes) -> str:
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def link_keys(settings: Settings) -> LinkKeys:
    """The configured keys; unset, on SQLite the key file next to the database file (made
    on first start), on in-memory SQLite a key for this process only. On PostgreSQL the
    keys must be configured: every instance must sign with the same one."""
    configured = settings.signing_secrets
    if configured:
        return LinkKeys(
            configured,
            f"LOCKGATE_SIGNING_KEYS ({len(configured)} key(s); the first signs, all verify)",
        )
    if not settings.is_sqlite:
        raise SigningKeysMissing()
    database = sqlite_file(settings.database_url)
    if database is None:
        # Nothing outlives the process here, links included.
        return LinkKeys(
            (secrets.token_bytes(32),),
            "a key of this process only (in-memory database, LOCKGATE_SIGNING_KEYS unset)",
        )
    path = database.with_name(database.name + ".key").absolute()
    key, created = _key_file(path)
    return LinkKeys(
        (key,),
        f"the key file {path} ({'created now' if created else 'reused'}; "
        "LOCKGATE_SIGNING_KEYS unset). Keep it out of database backups: with it, a copy of "
        "the database opens the links of paused calls",
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
            f"Could not create the approval-link signing key file {path}: {exc.strerror}. "
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
            f"Could not read the approval-link signing key file {path}: {reason}."
        ) from None
    if len(key) < MIN_SIGNING_KEY_CHARS:
        raise SigningKeyFileInvalid(
            f"The approval-link signing key file {path} holds no key (fewer than "
            f"{MIN_SIGNING_KEY_CHARS} characters). Delete it to have a new one made (the "
            "links of paused calls then stop working; each call's next answer has a new one)."
        )
    if stat.S_IMODE(mode) & 0o077:
        log.warning(
            "the approval-link signing key file %s can be read by other users; make it "
            "private: chmod 600 %s",
            path,
            path,
        )
    return key.encode()


def _sync_directory(directory: Path) -> None:
    """Make the new file's name durable: a key lost to a power cut would void every link."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- the links ----------------------------------------------------------------------------------


def link_name(execution_id: str, call_seq: int, key_id: str | None) -> str:
    """What a call's link is handed out as (`ApprovalToken.link`)."""
    return f"{execution_id}:{call_seq}:{key_id or ''}"


#: A link as its URL carries it: `<id>-<mac>`, 32 hex digits and an unpadded base64url
#: HMAC-SHA256 (URL-safe, and `-` never occurs in the id).
_TOKEN = re.compile(r"(?P<id>[0-9a-f]{32})-(?P<mac>[A-Za-z0-9_-]{43})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _signed(row: ApprovalToken) -> bytes:
    """What a link's mac covers: its id and everything its row binds it to, unambiguously
    (a JSON array), so a row edited to point elsewhere no longer verifies."""
    expires = (row.expires_at - _EPOCH) // timedelta(microseconds=1)  # exact, any backend
    fields = [
        "lockgate approval link v1",
        row.id,
        row.execution_id,
        row.call_seq,
        row.principal_id,
        row.key_id,
        expires,
    ]
    return json.dumps(fields, separators=(",", ":")).encode()


#: What a used link is refused with (the page's hint says what to do instead).
USED = (
    "This approval link was already used: a decision was already sent with it, and each "
    "link decides once."
)
UNKNOWN = "This approval link is not valid. Ask for a new one from the agent's client."
#: Expired links are kept this long (so a late click still gets "expired", not "unknown").
KEEP_EXPIRED = timedelta(days=1)
#: How often minting also purges old links.
PURGE_EVERY = timedelta(hours=1)


class ApprovalTokens:
    def __init__(self, store: SqlStore, keys: ApiKeys, signing: LinkKeys) -> None:
        self.store, self.keys, self.signing = store, keys, signing
        self._last_purge = datetime.min.replace(tzinfo=UTC)

    def link(
        self,
        execution_id: str,
        call_seq: int,
        principal_id: str,
        expires_at: datetime,
        *,
        key_id: str | None,
        now: datetime,
    ) -> str:
        """The token of the call's link for `key_id`: the one handed out before while it
        can still decide this call until `expires_at`, else a new one (which replaces it)."""
        held = self.store.approval_tokens.by_link(link_name(execution_id, call_seq, key_id))
        if (
            held is not None
            and held.used_at is None
            and held.expires_at == expires_at
            and now < held.expires_at
            and self._key_alive(held)
        ):
            return self.token_of(held)
        row = self._row(execution_id, call_seq, principal_id, expires_at, key_id, now)
        row.link = link_name(execution_id, call_seq, key_id)
        won = self.store.approval_tokens.hand_out(row, retire=held.id if held is not None else None)
        return self.token_of(won)

    def mint(
        self,
        execution_id: str,
        call_seq: int,
        principal_id: str,
        expires_at: datetime,
        key_id: str | None = None,
        *,
        now: datetime,
    ) -> str:
        """A link of its own, never handed out again (a second link to one call)."""
        row = self._row(execution_id, call_seq, principal_id, expires_at, key_id, now)
        self.store.approval_tokens.add(row)
        return self.token_of(row)

    def token_of(self, row: ApprovalToken) -> str:
        """The row's link as its URL carries it, signed with the current signing key (the
        same on every instance, every time, until the keys are rotated)."""
        return f"{row.id}-{self.signing.sign(_signed(row))}"

    def _row(
        self,
        execution_id: str,
        call_seq: int,
        principal_id: str,
        expires_at: datetime,
        key_id: str | None,
        now: datetime,
    ) -> ApprovalToken:
        if now - self._last_purge >= PURGE_EVERY:
            self._last_purge = now
            self.purge(now - KEEP_EXPIRED)
        return ApprovalToken(
            # Not a secret (the mac is): random only so that ids say nothing and never clash.
            id=secrets.token_hex(16),
            execution_id=execution_id,
            call_seq=call_seq,
            principal_id=principal_id,
            key_id=key_id,
            created_at=now,
            expires_at=expires_at,
        )

    def _verified(self, token: str) -> ApprovalToken | None:
        """The row `token` names, if its mac is right under one of the keys."""
        parts = _TOKEN.fullmatch(token)
        if parts is None:
            return None
        row = self.store.approval_tokens.get(parts["id"])
        if row is None or not self.signing.verify(_signed(row), parts["mac"]):
            return None
        return row

    def check(self, token: str, execution_id: str | None = None, *, now: datetime) -> ApprovalToken:
        """The link's row if it may still be used (for `execution_id`, when given)."""
        row = self._verified(token)
        if row is None or (execution_id is not None and row.execution_id != execution_id):
            raise TokenRefused("unknown", UNKNOWN)
        if row.used_at is not None:
            raise TokenRefused("used", USED)
        if now >= row.expires_at:
            raise TokenRefused("expired", "This approval link has expired.")
        if not self._key_alive(row):
            raise TokenRefused(
                "revoked",
                "This approval link no longer works: the API key it was issued under has "
                "been revoked.",
            )
        return row

    def _key_alive(self, row: ApprovalToken) -> bool:
        """A link is worth no more than the key it was issued under."""
        if row.key_id is not None:
            return self.keys.is_active(row.key_id)
        return self.keys.has_active_key(row.principal_id)

    def purge(self, older_than: datetime) -> int:
        """Delete links that expired before `older_than` (they can only be refused)."""
        return self.store.approval_tokens.purge(older_than)

    def use(self, row: ApprovalToken, *, now: datetime) -> UseApprovalToken:
        """The write that uses the link (`check`ed to `row`) up: made in the transaction of
        the decision it carries, never on its own, so that a link is used exactly when its
        decision is."""
        return UseApprovalToken(row.id, now)
