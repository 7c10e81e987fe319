"""People who approve: approvers, whose calls each may decide, and how they sign in.

A principal is an agent's API key; a person is not. In approval modes `native` and `browser`
only a person accepts a gated call through the page or the inbox, and a person is someone
the operator added as an approver (`lockgate approvers add`) who signed in: with the
operator's OpenID provider, or with a passkey registered through a one-time enrolment link
printed on the operator's terminal.

- An **enrolment link** (`spec/enrolment.py`) carries `<id>.<secret>`; the row keeps the
  secret's sha256, so neither the database nor anything an agent ever saw opens it. The
  passkey registered with it, the link's use and the person's first session commit together.
- A **session** (`spec/approver_session.py`) is a cookie carrying `<id>.<secret>` the same
  way; any instance knows the person from it after any restart, until it expires or is
  signed out.

The rows move through the write path like every lifecycle; approvers, grants and passkeys
are configuration (`machine/db/people_queries.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from lockgate.machine.approval_audit import PersonRef
from lockgate.machine.db.people_queries import (
    EVERY_PRINCIPAL,
    DeleteApprover,
    IdentityTaken,
)
from lockgate.machine.db.schema import (
    Approver,
    ApproverSession,
    Enrolment,
    Passkey,
)
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict, ErrorCode, GuardRefused, LockgateError
from lockgate.machine.records import RowRecord
from lockgate.machine.settings import Settings
from lockgate.machine.sign_in_challenges import SignInChallenges
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import ApproverSessionStatus as A
from lockgate.spec import EnrolmentStatus as N

log = logging.getLogger("lockgate.people")

#: What a passkey approver's issuer is stored as.
PASSKEY_ISSUER = "passkey"
#: Rows one upkeep round expires at most.
ROUND = 200
#: Longest name and email accepted.
MAX_NAME = 200
MAX_EMAIL = 320


class ApproverProblem(LockgateError):
    """The operator's approver command cannot be done as asked."""

    code = ErrorCode.INVALID_INPUT


class ApproverNotFound(LockgateError):
    code = ErrorCode.NOT_FOUND


class EnrolmentRefused(LockgateError):
    """An enrolment link that cannot be used: `reason` is unknown, used, expired or revoked."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(
            message,
            hint="Ask the operator for a new link: lockgate approvers enrol <approver id>.",
        )
        self.reason = reason


@dataclass(frozen=True)
class SignedIn:
    """A person with an active session."""

    session_id: str
    approver: Approver
    method: str
    expires_at: datetime

    @property
    def person(self) -> PersonRef:
        return PersonRef(
            issuer=self.approver.issuer,
            subject=self.approver.subject or "",
            name=self.approver.name,
            email=self.approver.email,
            signed_in_with=self.method,
        )


@dataclass(frozen=True)
class Issued:
    """A secret handed out once (an enrolment link's, a session cookie's), with its row."""

    token: str
    row_id: str
    expires_at: datetime


@dataclass(frozen=True)
class NewPasskey:
    """A passkey whose registration was verified (by the server's WebAuthn check)."""

    credential_id: str
    public_key: bytes
    sign_count: int
    transports: list[str]


@dataclass(frozen=True)
class ApproverListing:
    approver: Approver
    principals: list[str]
    passkeys: int
    active_sessions: int
    enrolment_pending: bool


def _secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_secret() -> tuple[str, str, str]:
    """(row id, secret, token): the token `<id>.<secret>` is what the person holds."""
    row_id, secret = secrets.token_hex(16), secrets.token_urlsafe(32)
    return row_id, secret, f"{row_id}.{secret}"


def _split(token: str) -> tuple[str, str] | None:
    row_id, dot, secret = token.partition(".")
    if not dot or len(row_id) != 32 or not secret or len(secret) > 100:
        return None
    return row_id, secret


def _matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(_secret_hash(secret), stored_hash)


class People:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        settings: Settings,
        clock: Callable[[], datetime],
    ) -> None:
        self.store, self.write, self.settings, self.clock = store, write, settings, clock
        self.rows, self.sign_ins = store.approvers, store.sign_ins
        #: Sign-ins in progress (an OpenID Connect state, a WebAuthn challenge).
        self.challenges = SignInChallenges(store.sign_ins, clock)

    # -- approvers ------------------------------------------------------------------------

    def add(
        self,
        name: str,
        *,
        principals: Sequence[str],
        email: str | None = None,
        issuer: str | None = None,
        subject: str | None = None,
    ) -> Approver:
        """Add a person who may decide `principals`' calls (`*`: every principal's). With
        an `issuer`, they sign in there (by `subject`, or by their verified `email` until
        their first sign-in binds the subject); without one, with a passkey."""
        name = name.strip()
        if not name or len(name) > MAX_NAME:
            raise ApproverProblem(f"An approver needs a name of 1 to {MAX_NAME} characters.")
        if email is not None and (len(email) > MAX_EMAIL or "@" not in email):
            raise ApproverProblem(f"{email[:80]!r} is not an email address.")
        if not principals:
            raise ApproverProblem(
                "Say whose calls the approver decides: --principal NAME (repeatable), or "
                "--all-principals."
            )
        if issuer is None:
            if subject is not None:
                raise ApproverProblem(
                    "--subject names someone at an OpenID provider: add --issuer."
                )
            sign_in, issuer, subject = PASSKEY_ISSUER, PASSKEY_ISSUER, secrets.token_urlsafe(32)
        else:
            if issuer == PASSKEY_ISSUER or not issuer.startswith(("https://", "http://")):
                raise ApproverProblem(f"{issuer[:200]!r} is not an OpenID provider's issuer URL.")
            if subject is None and email is None:
                raise ApproverProblem(
                    "An approver who signs in with an OpenID provider needs --subject (the "
                    "provider's id for them) or --email (their verified email there)."
                )
            sign_in = "oidc"
        approver = Approver(
            id=secrets.token_hex(8),
            name=name,
            email=email,
            sign_in=sign_in,
            issuer=issuer,
            subject=subject,
            created_at=self.clock(),
        )
        try:
            self.rows.add_approver(approver, principals)
        except IdentityTaken:
            raise ApproverProblem(
                f"Another approver already signs in as {subject} at {issuer}."
            ) from None
        log.info("approver %s (%s) added for %s", approver.id, approver.name, list(principals))
        return approver

    def get(self, approver_id: str) -> Approver:
        approver = self.rows.approver(approver_id)
        if approver is None:
            raise ApproverNotFound(
                f"No approver {approver_id[:40]!r}.", hint="lockgate approvers list shows them."
            )
        return approver

    def listing(self) -> list[ApproverListing]:
        out = []
        for approver in self.rows.approvers():
            out.append(
                ApproverListing(
                    approver=approver,
                    principals=self.rows.grants(approver.id),
                    passkeys=len(self.rows.passkeys_of(approver.id)),
                    active_sessions=len(self.sign_ins.active_sessions(approver.id)),
                    enrolment_pending=bool(self.sign_ins.issued_enrolments(approver.id)),
                )
            )
        return out

    def remove(self, approver_id: str) -> Approver:
        """Remove the approver, signing them out everywhere and revoking their enrolment
        links in the same transaction."""
        approver = self.get(approver_id)
        steps = [
            *(
                Step(RowRecord.of("approver_session", row), "sign_out")
                for row in self.sign_ins.active_sessions(approver_id)
            ),
            *(
                Step(RowRecord.of("enrolment", row), "revoke")
                for row in self.sign_ins.issued_enrolments(approver_id)
            ),
        ]
        if steps:
            self.write.apply(*steps, writes=[DeleteApprover(approver_id)])
        else:
            self.rows.delete_approver(approver_id)
        log.info("approver %s (%s) removed", approver.id, approver.name)
        return approver

    def may_decide(self, approver_id: str, principal_id: str) -> bool:
        return self.rows.may_decide(approver_id, principal_id)

    def principals_of(self, approver_id: str) -> list[str] | None:
        """The principals the approver decides for; None for every principal."""
        granted = self.rows.grants(approver_id)
        return None if EVERY_PRINCIPAL in granted else granted

    # -- enrolment links ------------------------------------------------------------------

    def issue_enrolment(self, approver_id: str) -> Issued:
        """A new one-time passkey enrolment link for the approver (earlier unused ones are
        revoked: one link is ever valid per person)."""
        approver = self.get(approver_id)
        if approver.sign_in != PASSKEY_ISSUER:
            raise ApproverProblem(
                f"{approver.name} signs in with {approver.issuer}, not with a passkey."
            )
        for row in self.sign_ins.issued_enrolments(approver_id):
            with contextlib.suppress(Conflict):  # used or revoked meanwhile
                self.write.apply(Step(RowRecord.of("enrolment", row), "revoke"))
        row_id, secret, token = _new_secret()
        now = self.clock()
        expires = now + self.settings.enrolment_ttl
        self.write.create(
            "enrolment",
            Enrolment(
                id=row_id,
                approver_id=approver_id,
                secret_hash=_secret_hash(secret),
                status=N.ISSUED,
                created_at=now,
                expires_at=expires,
            ),
        )
        # The link itself is printed on the operator's terminal only, never logged.
        log.info("enrolment link %s issued for approver %s", row_id, approver_id)
        return Issued(token=token, row_id=row_id, expires_at=expires)

    def enrolment(self, token: str) -> tuple[Enrolment, Approver]:
        """The enrolment a link names, if it can still be used (else `EnrolmentRefused`)."""
        parts = _split(token)
        row = self.sign_ins.enrolment(parts[0]) if parts is not None else None
        if parts is None or row is None or not _matches(parts[1], row.secret_hash):
            raise EnrolmentRefused("unknown", "This enrolment link is not valid.")
        if row.status == N.USED:
            raise EnrolmentRefused(
                "used", "This enrolment link was used already: a passkey was registered with it."
            )
        if row.status == N.REVOKED:
            raise EnrolmentRefused("revoked", "This enrolment link was replaced by a newer one.")
        if row.status == N.EXPIRED or self.clock() >= row.expires_at:
            if row.status == N.ISSUED:  # found past its lifetime: expired now
                self._expire(RowRecord.of("enrolment", row))
            raise EnrolmentRefused("expired", "This enrolment link has expired.")
        approver = self.rows.approver(row.approver_id)
        if approver is None:
            raise EnrolmentRefused("revoked", "The approver this link was for was removed.")
        return row, approver

    def complete_enrolment(self, token: str, passkey: NewPasskey) -> Issued:
        """Store the passkey registered with the link, use the link up and sign the person
        in: one transaction, so a link registers one passkey at most."""
        row, approver = self.enrolment(token)
        if self.rows.passkey(passkey.credential_id) is not None:
            raise EnrolmentRefused("used", "This passkey is registered already.")
        now = self.clock()
        session_row, issued = self._session_row(approver, "passkey", now)
        try:
            self.write.apply(
                Step(RowRecord.of("enrolment", row), "use"),
                inserts=[
                    Passkey(
                        id=passkey.credential_id,
                        approver_id=approver.id,
                        public_key=passkey.public_key,
                        sign_count=passkey.sign_count,
                        transports=list(passkey.transports),
                        created_at=now,
                    ),
                    session_row,
                ],
            )
        except (Conflict, GuardRefused):
            # Used, revoked or expired between the check and the commit: say which.
            self.enrolment(token)
            raise EnrolmentRefused("used", "This enrolment link was used already.") from None
        log.info("approver %s registered a passkey (enrolment %s)", approver.id, row.id)
        return issued

    # -- sessions -------------------------------------------------------------------------

    def _session_row(
        self, approver: Approver, method: str, now: datetime
    ) -> tuple[ApproverSession, Issued]:
        row_id, secret, token = _new_secret()
        expires = now + self.settings.approver_session_ttl
        row = ApproverSession(
            id=row_id,
            approver_id=approver.id,
            secret_hash=_secret_hash(secret),
            method=method,
            status=A.ACTIVE,
            created_at=now,
            expires_at=expires,
        )
        return row, Issued(token=token, row_id=row_id, expires_at=expires)

    def open_session(self, approver: Approver, method: str) -> Issued:
        """Sign the person in: a new session, whose cookie is the returned token."""
        row, issued = self._session_row(approver, method, self.clock())
        self.write.create("approver_session", row)
        log.info("approver %s signed in with %s (session %s)", approver.id, method, row.id)
        return issued

    def signed_in(self, token: str | None) -> SignedIn | None:
        """The person a session cookie names, while the session is active."""
        parts = _split(token) if token else None
        if parts is None:
            return None
        row = self.sign_ins.approver_session(parts[0])
        if row is None or row.status != A.ACTIVE or not _matches(parts[1], row.secret_hash):
            return None
        if self.clock() >= row.expires_at:
            self._expire(RowRecord.of("approver_session", row))
            return None
        approver = self.rows.approver(row.approver_id)
        if approver is None:
            return None
        return SignedIn(
            session_id=row.id, approver=approver, method=row.method, expires_at=row.expires_at
        )

    def sign_out(self, session_id: str) -> bool:
        """End one session; False when it was not active."""
        row = self.sign_ins.approver_session(session_id)
        if row is None or row.status != A.ACTIVE:
            return False
        try:
            self.write.apply(Step(RowRecord.of("approver_session", row), "sign_out"))
        except Conflict:
            return False
        log.info("approver session %s signed out", session_id)
        return True

    def sign_out_everywhere(self, approver_id: str | None = None) -> int:
        """End every active session of the approver (of everyone, for None)."""
        ended = 0
        for row in self.sign_ins.active_sessions(approver_id):
            ended += self.sign_out(row.id)
        return ended

    # -- upkeep ---------------------------------------------------------------------------

    def _expire(self, record: RowRecord[Enrolment] | RowRecord[ApproverSession]) -> None:
        # Moved meanwhile (used, signed out, or already expired): nothing to do.
        with contextlib.suppress(Conflict, GuardRefused):
            self.write.apply(Step(record, "expire"))

    def expire_due(self) -> int:
        """Expire the sessions and enrolment links past their lifetime, and drop sign-in
        challenges nobody finished (the maintenance round)."""
        now = self.clock()
        lapsed: list[RowRecord[Enrolment] | RowRecord[ApproverSession]] = [
            *(
                RowRecord.of("approver_session", r)
                for r in self.sign_ins.sessions_lapsed(now, ROUND)
            ),
            *(RowRecord.of("enrolment", r) for r in self.sign_ins.enrolments_lapsed(now, ROUND)),
        ]
        for record in lapsed:
            self._expire(record)
        self.challenges.purge()
        return len(lapsed)
