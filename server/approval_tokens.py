"""Single-use approval tokens: what makes an approval URL unguessable and bound to one call."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, update
from sqlmodel import col

from machine.db.schema import ApprovalToken
from machine.db.store import SqlStore
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


#: Expired tokens are kept this long (so a late click still gets "expired", not "unknown").
KEEP_EXPIRED = timedelta(days=1)
#: How often minting also purges old tokens.
PURGE_EVERY = timedelta(hours=1)


class ApprovalTokens:
    def __init__(self, store: SqlStore, keys: ApiKeys) -> None:
        self.store, self.keys = store, keys
        self._last_purge = datetime.min.replace(tzinfo=UTC)

    def mint(
        self,
        execution_id: str,
        call_seq: int,
        principal_id: str,
        expires_at: datetime,
        key_id: str | None = None,
    ) -> str:
        token = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        if now - self._last_purge >= PURGE_EVERY:
            self._last_purge = now
            self.purge(now - KEEP_EXPIRED)
        with self.store.session() as s:
            s.add(
                ApprovalToken(
                    token_hash=_hash(token),
                    execution_id=execution_id,
                    call_seq=call_seq,
                    principal_id=principal_id,
                    key_id=key_id,
                    created_at=datetime.now(UTC),
                    expires_at=expires_at,
                )
            )
            s.commit()
        return token

    def check(self, token: str, execution_id: str | None = None) -> ApprovalToken:
        """The token's row if it may still be used (for `execution_id`, when given)."""
        with self.store.session() as s:
            row = s.get(ApprovalToken, _hash(token))
        if row is None or (execution_id is not None and row.execution_id != execution_id):
            raise TokenRefused(
                "unknown",
                "This approval link is not valid. Ask for a new one from the agent's client.",
            )
        if row.used_at is not None:
            raise TokenRefused("used", "This approval link was already used.")
        if datetime.now(UTC) >= row.expires_at:
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

    def release(self, token: str) -> None:
        """Give a used token back: the decision it carried was not taken (the execution
        could not accept it), so the approver may try again."""
        with self.store.session() as s:
            s.execute(
                update(ApprovalToken)
                .where(col(ApprovalToken.token_hash) == _hash(token))
                .values(used_at=None)
            )
            s.commit()

    def purge(self, older_than: datetime) -> int:
        """Delete tokens that expired before `older_than` (they can only be refused)."""
        with self.store.session() as s:
            result = s.execute(
                delete(ApprovalToken).where(col(ApprovalToken.expires_at) < older_than)
            )
            s.commit()
        return int(result.rowcount)  # type: ignore[attr-defined]

    def consume(self, token: str, execution_id: str) -> ApprovalToken:
        """Use the token up (once: a conditional update, so two clicks cannot both pass)."""
        row = self.check(token, execution_id)
        with self.store.session() as s:
            result = s.execute(
                update(ApprovalToken)
                .where(
                    col(ApprovalToken.token_hash) == row.token_hash,
                    col(ApprovalToken.used_at).is_(None),
                )
                .values(used_at=datetime.now(UTC))
            )
            s.commit()
        if result.rowcount != 1:  # type: ignore[attr-defined]
            raise TokenRefused("used", "This approval link was already used.")
        return row
