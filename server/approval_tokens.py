"""Single-use approval tokens: what makes an approval URL unguessable and bound to one call.

A paused call has one link per API key: minted the first time an answer shows the call, and
the same link in every answer after that (`link`). What a person reading the page needs is
that every link they were given for the call is the same one, and that it works exactly as
long as the call can still be decided: until it is used, or until the call's deadline (the
expiry the page shows), measured on the runtime's clock like the deadline itself. Only a
link that can no longer decide (used, expired, or its key revoked) is replaced.

Every time here is the caller's `now`, from the runtime's clock: expiry follows the same
clock as the call's deadline. The rows are read and written through the store; a token is
used up only by the decision it carries, in that decision's transaction (`use`).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

from machine.db.schema import ApprovalToken
from machine.db.store import SqlStore, UseApprovalToken
from machine.errors import ErrorCode, LockgateError
from server.keys import ApiKeys


class TokenRefused(LockgateError):
    """An approval token that cannot be used: `reason` is unknown, used, expired or revoked."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def link_name(execution_id: str, call_seq: int, key_id: str | None) -> str:
    """What a call's link is handed out as (`ApprovalToken.link`)."""
    return f"{execution_id}:{call_seq}:{key_id or ''}"


#: What a used link is refused with (the page's hint says what to do instead).
USED = (
    "This approval link was already used: a decision was already sent with it, and each "
    "link decides once."
)
#: Expired tokens are kept this long (so a late click still gets "expired", not "unknown").
KEEP_EXPIRED = timedelta(days=1)
#: How often minting also purges old tokens.
PURGE_EVERY = timedelta(hours=1)


class ApprovalTokens:
    def __init__(self, store: SqlStore, keys: ApiKeys) -> None:
        self.store, self.keys = store, keys
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
        held = self.store.approval_link(link_name(execution_id, call_seq, key_id))
        if (
            held is not None
            and held.token is not None
            and held.used_at is None
            and held.expires_at == expires_at
            and now < held.expires_at
            and self._key_alive(held)
        ):
            return held.token
        token = secrets.token_urlsafe(32)
        row = self._row(token, execution_id, call_seq, principal_id, expires_at, key_id, now)
        row.link, row.token = link_name(execution_id, call_seq, key_id), token
        won = self.store.hand_out_approval_link(
            row, retire=held.token_hash if held is not None else None
        )
        assert won.token is not None
        return won.token

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
        """A token of its own, never handed out again (what links minted before 0006 are)."""
        token = secrets.token_urlsafe(32)
        self.store.add_approval_token(
            self._row(token, execution_id, call_seq, principal_id, expires_at, key_id, now)
        )
        return token

    def _row(
        self,
        token: str,
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
            token_hash=_hash(token),
            execution_id=execution_id,
            call_seq=call_seq,
            principal_id=principal_id,
            key_id=key_id,
            created_at=now,
            expires_at=expires_at,
        )

    def check(self, token: str, execution_id: str | None = None, *, now: datetime) -> ApprovalToken:
        """The token's row if it may still be used (for `execution_id`, when given)."""
        row = self.store.approval_token(_hash(token))
        if row is None or (execution_id is not None and row.execution_id != execution_id):
            raise TokenRefused(
                "unknown",
                "This approval link is not valid. Ask for a new one from the agent's client.",
            )
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
        """Delete tokens that expired before `older_than` (they can only be refused)."""
        return self.store.purge_approval_tokens(older_than)

    def use(self, token: str, *, now: datetime) -> UseApprovalToken:
        """The write that uses the token up: made in the transaction of the decision it
        carries, never on its own, so that a link is used exactly when its decision is."""
        return UseApprovalToken(_hash(token), now)
