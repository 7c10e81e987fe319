"""Sign-ins in progress: the single-use challenges an OpenID Connect state or a WebAuthn
ceremony is kept under between its two requests, so any instance can finish what another
began. Anyone may start one, so how many are open at once is bounded."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import JsonValue

from lockgate.machine.db.people_queries import SignInQueries
from lockgate.machine.db.schema import SignInChallenge
from lockgate.machine.errors import ErrorCode, LockgateError

#: Sign-ins in progress at once, for everyone (each a row until it is finished or expires).
MAX_OPEN_SIGN_INS = 10_000
#: Longest challenge id accepted back (ids handed out are 43 characters).
MAX_CHALLENGE_ID = 64


class SignInsBusy(LockgateError):
    code = ErrorCode.LIMIT_REACHED


class SignInChallenges:
    def __init__(self, rows: SignInQueries, clock: Callable[[], datetime]) -> None:
        self.rows, self.clock = rows, clock

    def begin(self, kind: str, data: dict[str, JsonValue], lasts: timedelta) -> str:
        """A challenge for a sign-in of `kind` that can be finished once within `lasts`:
        its id."""
        now = self.clock()
        if self.rows.open_challenges(now) >= MAX_OPEN_SIGN_INS:
            raise SignInsBusy(
                f"{MAX_OPEN_SIGN_INS} sign-ins are in progress here already.",
                hint="Try again in a few minutes (unfinished ones expire).",
            )
        row_id = secrets.token_urlsafe(32)
        self.rows.save_challenge(
            SignInChallenge(id=row_id, kind=kind, data=data, created_at=now, expires_at=now + lasts)
        )
        return row_id

    def finish(self, challenge_id: object, kind: str) -> dict[str, JsonValue] | None:
        """The data of a sign-in in progress, taken once (None: unknown, of another kind,
        finished already, or expired)."""
        if not isinstance(challenge_id, str) or len(challenge_id) > MAX_CHALLENGE_ID:
            return None
        row = self.rows.take_challenge(challenge_id, kind, self.clock())
        return row.data if row is not None and isinstance(row.data, dict) else None

    def purge(self) -> None:
        """Drop the challenges nobody finished in time."""
        self.rows.purge_challenges(self.clock())
