"""Reads of durable MCP sessions and the owed-request ledger (for machine/sessions.py).

Sessions and owed requests change only through the write path; these are the reads that
decide which steps to take (which sessions to sweep, what a dead incarnation owed, which
reports nobody can collect any more).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlmodel import col, func, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import OwedRequest, Session
from lockgate.spec import SESSION, OwedRequestStatus, SessionStatus

#: The session states that can still take requests (and so collect reports).
#: Derived from the spec (its non-terminal states: active, idle); sorted, as a stable literal
#: list for the queries that filter on it.
LIVE_SESSION_STATUSES = tuple(sorted(SESSION.live_names))


class SessionQueries(Queries):
    def get(self, session_id: str) -> Session | None:
        """The session by id (primary key), in any state."""
        with self._session() as s:
            return s.get(Session, session_id)

    def owed(self, owed_id: str) -> OwedRequest | None:
        """One owed-request entry by id (primary key), in any state."""
        with self._session() as s:
            return s.get(OwedRequest, owed_id)

    def live_count(self, principal_id: str) -> int:
        """How many of the principal's sessions are live, across instances: what its session
        limit is checked against (index on `sessions.principal_id`)."""
        with self._session() as s:
            count = s.exec(
                select(func.count()).where(
                    Session.principal_id == principal_id,
                    col(Session.status).in_(LIVE_SESSION_STATUSES),
                )
            ).one()
        return int(count)

    def live(self) -> list[Session]:
        """Every live session, of every instance: what the lease sweep decides on (index on
        `sessions.status`, so ended sessions are never read)."""
        with self._session() as s:
            return list(
                s.exec(select(Session).where(col(Session.status).in_(LIVE_SESSION_STATUSES)))
            )

    def active_of(self, incarnations: Collection[int]) -> list[Session]:
        """Sessions still marked active by one of `incarnations` (dead ones): recovery sends
        them idle, since nothing serves their requests any more."""
        with self._session() as s:
            return list(
                s.exec(
                    select(Session).where(
                        Session.status == SessionStatus.ACTIVE,
                        col(Session.incarnation).in_(incarnations),
                    )
                )
            )

    def owed_here(self, session_id: str, incarnation: int) -> int:
        """How many requests `incarnation` still owes an answer on the session (entries of
        other incarnations never count): one input of the lease decision (index on
        `owed_requests.session_id`)."""
        with self._session() as s:
            count = s.exec(
                select(func.count()).where(
                    OwedRequest.session_id == session_id,
                    OwedRequest.status == OwedRequestStatus.OWED,
                    OwedRequest.incarnation == incarnation,
                )
            ).one()
        return int(count)

    def of_session(self, session_id: str, status: OwedRequestStatus) -> list[OwedRequest]:
        """The session's ledger entries in `status` (unordered; callers sort what they show):
        its lost requests to report or abandon, or what is still owed on it (index on
        `owed_requests.session_id`)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(OwedRequest).where(
                        OwedRequest.session_id == session_id, OwedRequest.status == status
                    )
                )
            )

    def owed_by(
        self, incarnations: Collection[int], session_id: str | None = None
    ) -> list[OwedRequest]:
        """Entries still owed by one of `incarnations` (dead ones, which will never answer
        them), of one session when given: recovery declares them lost (index on
        `owed_requests.status`, or `owed_requests.session_id` for one session)."""
        with self._session() as s:
            query = select(OwedRequest).where(
                OwedRequest.status == OwedRequestStatus.OWED,
                col(OwedRequest.incarnation).in_(incarnations),
            )
            if session_id is not None:
                query = query.where(OwedRequest.session_id == session_id)
            return list(s.exec(query))

    def lost_of_ended_sessions(self) -> list[OwedRequest]:
        """Lost entries whose session is no longer live, so that no GET will ever collect
        their report: recovery abandons them (index on `owed_requests.status`, joined to
        the session by primary key)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(OwedRequest)
                    .join(Session, col(Session.id) == col(OwedRequest.session_id))
                    .where(
                        OwedRequest.status == OwedRequestStatus.LOST,
                        col(Session.status).not_in(LIVE_SESSION_STATUSES),
                    )
                )
            )
