"""People who approve (for machine/people.py): approvers and whose calls they may decide,
their passkeys, enrolment links, signed-in sessions, and sign-in challenges.

Approvers, grants and passkeys are configuration, written in transactions of their own here
(like API keys). Enrolment links and approver sessions are lifecycle records: they are only
read here, and move through the write path. A sign-in challenge is a nonce: saved here, and
taken by deleting it, so it is used at most once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from sqlalchemy import Connection, bindparam, delete, exists, func, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import (
    Approver,
    ApproverGrant,
    ApproverSession,
    Enrolment,
    Passkey,
    SignInChallenge,
)
from lockgate.spec import ApproverSessionStatus as A
from lockgate.spec import EnrolmentStatus as N


# The maintenance round's reads, built once (every round asks them; a statement built anew
# cost more than SQLite's answer).
@cache
def _sessions_lapsed() -> SelectOfScalar[ApproverSession]:
    return (
        select(ApproverSession)
        .where(
            ApproverSession.status == A.ACTIVE,
            col(ApproverSession.expires_at) <= bindparam("now"),
        )
        .limit(bindparam("limit"))
    )


@cache
def _enrolments_lapsed() -> SelectOfScalar[Enrolment]:
    return (
        select(Enrolment)
        .where(Enrolment.status == N.ISSUED, col(Enrolment.expires_at) <= bindparam("now"))
        .limit(bindparam("limit"))
    )


@cache
def _any_challenge_expired() -> SelectOfScalar[bool]:
    return select(exists().where(col(SignInChallenge.expires_at) <= bindparam("now")))


#: The grant that covers every principal.
EVERY_PRINCIPAL = "*"


class IdentityTaken(Exception):
    """Another approver already has this issuer and subject."""


@dataclass(frozen=True)
class DeleteApprover:
    """Delete an approver with its grants and passkeys, in the transaction that ends its
    sessions and revokes its enrolment links (a `StoreWrite`): a removed person is signed
    out everywhere in the same commit that removes them."""

    approver_id: str

    def write(self, conn: Connection) -> None:
        for table, column in (
            (ApproverGrant, ApproverGrant.approver_id),
            (Passkey, Passkey.approver_id),
            (Approver, Approver.id),
        ):
            conn.execute(delete(table).where(col(column) == self.approver_id))


class ApproverQueries(Queries):
    """Approvers, whose calls each decides, and their passkeys (`store.approvers`)."""

    def add_approver(self, approver: Approver, principals: Sequence[str]) -> None:
        """Insert `approver` with its grants, in one transaction."""
        try:
            with self._writing() as s:
                s.add(approver)
                s.flush()
                for principal in dict.fromkeys(principals):
                    s.add(ApproverGrant(approver_id=approver.id, principal_id=principal))
        except IntegrityError:
            raise IdentityTaken() from None

    def approver(self, approver_id: str) -> Approver | None:
        """The approver by id (primary key): whom a session or a passkey belongs to."""
        return self._get(Approver, approver_id)

    def approvers(self) -> list[Approver]:
        """Every approver, oldest first (the operator's listing)."""
        with self._session() as s:
            return list(s.exec(select(Approver).order_by(col(Approver.created_at))))

    def by_identity(self, issuer: str, subject: str) -> Approver | None:
        """The approver an identity provider names (unique on issuer and subject)."""
        with self._session() as s:
            return s.exec(
                select(Approver).where(Approver.issuer == issuer, Approver.subject == subject)
            ).first()

    def unbound_by_email(self, issuer: str, email: str) -> Approver | None:
        """An approver of `issuer` added by email whose first sign-in is still to come."""
        with self._session() as s:
            return s.exec(
                select(Approver).where(
                    Approver.issuer == issuer,
                    col(Approver.subject).is_(None),
                    func.lower(col(Approver.email)) == email.lower(),
                )
            ).first()

    def bind_subject(self, approver_id: str, subject: str) -> bool:
        """Record the subject of an approver added by email, at their first sign-in; False
        when it was bound meanwhile (or the subject belongs to another approver)."""
        try:
            with self._writing() as s:
                row = s.get(Approver, approver_id)
                if row is None or row.subject is not None:
                    return False
                row.subject = subject
                s.add(row)
        except IntegrityError:
            return False
        return True

    def delete_approver(self, approver_id: str) -> None:
        """Remove an approver who has no active session and no enrolment link to end."""
        with self._writing() as s:
            DeleteApprover(approver_id).write(s.connection())

    def grants(self, approver_id: str) -> list[str]:
        """The principals the approver decides for (`*`: every principal)."""
        with self._session() as s:
            return sorted(
                s.exec(
                    select(ApproverGrant.principal_id).where(
                        ApproverGrant.approver_id == approver_id
                    )
                )
            )

    def may_decide(self, approver_id: str, principal_id: str) -> bool:
        """Whether a grant lets the approver decide the principal's calls (the principal's
        own grant or `*`; primary key on approver and principal)."""
        with self._session() as s:
            found = s.exec(
                select(ApproverGrant.principal_id)
                .where(
                    ApproverGrant.approver_id == approver_id,
                    or_(
                        col(ApproverGrant.principal_id) == principal_id,
                        col(ApproverGrant.principal_id) == EVERY_PRINCIPAL,
                    ),
                )
                .limit(1)
            ).first()
        return found is not None

    def count(self) -> int:
        """How many approvers exist (a first start adds one when there is none)."""
        with self._session() as s:
            return int(s.exec(select(func.count()).select_from(Approver)).one())

    def passkey(self, credential_id: str) -> Passkey | None:
        """The passkey a sign-in presents, by its credential id (primary key)."""
        return self._get(Passkey, credential_id)

    def passkeys_of(self, approver_id: str) -> list[Passkey]:
        """The approver's passkeys (index on approver): excluded from a new registration."""
        with self._session() as s:
            return list(s.exec(select(Passkey).where(Passkey.approver_id == approver_id)))

    def passkey_used(self, credential_id: str, sign_count: int, at: datetime) -> None:
        """Record a sign-in's signature counter (a cloned authenticator shows up as a
        counter that goes backwards, which the sign-in refuses before this)."""
        with self._writing() as s:
            row = s.get(Passkey, credential_id)
            if row is not None:
                row.sign_count, row.last_used_at = sign_count, at
                s.add(row)


class SignInQueries(Queries):
    """Enrolment links and signed-in sessions (lifecycle rows: read here, moved by the
    write path), and sign-in challenges (`store.sign_ins`)."""

    def enrolment(self, enrolment_id: str) -> Enrolment | None:
        """The enrolment a link names (primary key)."""
        return self._get(Enrolment, enrolment_id)

    def issued_enrolments(self, approver_id: str) -> list[Enrolment]:
        """The approver's links still usable (revoked when a new one is issued)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(Enrolment).where(
                        Enrolment.approver_id == approver_id, Enrolment.status == N.ISSUED
                    )
                )
            )

    def enrolments_lapsed(self, now: datetime, limit: int) -> list[Enrolment]:
        """Issued links past their expiry, for the maintenance round."""
        with self._session() as s:
            return list(s.exec(_enrolments_lapsed(), params={"now": now, "limit": limit}))

    def approver_session(self, session_id: str) -> ApproverSession | None:
        """The session a cookie names (primary key)."""
        return self._get(ApproverSession, session_id)

    def active_sessions(self, approver_id: str | None = None) -> list[ApproverSession]:
        """Active sessions: the approver's, or everyone's."""
        query = select(ApproverSession).where(ApproverSession.status == A.ACTIVE)
        if approver_id is not None:
            query = query.where(ApproverSession.approver_id == approver_id)
        with self._session() as s:
            return list(s.exec(query))

    def sessions_lapsed(self, now: datetime, limit: int) -> list[ApproverSession]:
        """Active sessions past their expiry, for the maintenance round (index on status)."""
        with self._session() as s:
            return list(s.exec(_sessions_lapsed(), params={"now": now, "limit": limit}))

    def save_challenge(self, row: SignInChallenge) -> None:
        """Store a sign-in in progress (its state, or a WebAuthn challenge)."""
        with self._writing() as s:
            s.add(row)

    def open_challenges(self, now: datetime) -> int:
        """How many sign-ins are in progress (unexpired challenges)."""
        with self._session() as s:
            return int(
                s.exec(
                    select(func.count())
                    .select_from(SignInChallenge)
                    .where(col(SignInChallenge.expires_at) > now)
                ).one()
            )

    def take_challenge(self, challenge_id: str, kind: str, now: datetime) -> SignInChallenge | None:
        """The challenge, deleted so that nobody takes it again; None when there is none of
        that kind, or it expired (an expired one is deleted too)."""
        with self._writing() as s:
            row = s.get(SignInChallenge, challenge_id)
            if row is None:
                return None
            s.delete(row)
        if row.kind != kind or now >= row.expires_at:
            return None
        return row

    def purge_challenges(self, now: datetime) -> int:
        """Delete the challenges that expired (sign-ins never finished). Read first, taking
        no lock: the maintenance round asks every time, and mostly none has."""
        with self._session() as s:
            if not s.exec(_any_challenge_expired(), params={"now": now}).one():
                return 0
        with self._writing() as s:
            result = s.connection().execute(
                delete(SignInChallenge).where(col(SignInChallenge.expires_at) <= now)
            )
            return int(result.rowcount)
