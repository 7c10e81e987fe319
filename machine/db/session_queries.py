"""Reads of durable MCP sessions and the owed-request ledger (for machine/sessions.py).

Sessions and owed requests change only through the write path; these are the reads that
decide which steps to take (which sessions to sweep, what a dead incarnation owed, which
reports nobody can collect any more).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, bindparam, text
from sqlmodel import col, func, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import OwedRequest, Session
from lockgate.spec import SESSION, OwedRequestStatus, SessionStatus

#: The session states that can still take requests (and so collect reports).
#: Derived from the spec (its non-terminal states: active, idle); sorted, as a stable literal
#: list for the queries that filter on it.
LIVE_SESSION_STATUSES = tuple(sorted(SESSION.live_names))


@cache
def _live_of() -> Any:
    return select(func.count()).where(
        Session.principal_id == bindparam("principal_id"),
        col(Session.status).in_(LIVE_SESSION_STATUSES),
    )


# What every request and every maintenance round asks, built once: a statement built anew
# cost more than SQLite's answer.
@cache
def _live() -> SelectOfScalar[Session]:
    return select(Session).where(col(Session.status).in_(LIVE_SESSION_STATUSES))


@cache
def _active() -> SelectOfScalar[Session]:
    return select(Session).where(Session.status == SessionStatus.ACTIVE)


@cache
def _owed_here() -> SelectOfScalar[int]:
    return select(func.count()).where(
        OwedRequest.session_id == bindparam("session_id"),
        OwedRequest.status == OwedRequestStatus.OWED,
        OwedRequest.incarnation == bindparam("incarnation"),
    )


@cache
def _of_session(statuses: int) -> SelectOfScalar[OwedRequest]:
    """A session's entries in one of `statuses` statuses (`:status_0`, ...): one bound
    parameter each, not a list SQLAlchemy expands at every execution, so that the statement
    is compiled once (and goes to SQLite's driver as is, `driver_statements`)."""
    return select(OwedRequest).where(
        OwedRequest.session_id == bindparam("session_id"),
        col(OwedRequest.status).in_([bindparam(f"status_{n}") for n in range(statuses)]),
    )


@cache
def _all_owed() -> SelectOfScalar[OwedRequest]:
    return select(OwedRequest).where(OwedRequest.status == OwedRequestStatus.OWED)


@cache
def _lost_of_ended_sessions() -> SelectOfScalar[OwedRequest]:
    return (
        select(OwedRequest)
        .join(Session, col(Session.id) == col(OwedRequest.session_id))
        .where(
            OwedRequest.status == OwedRequestStatus.LOST,
            col(Session.status).not_in(LIVE_SESSION_STATUSES),
        )
    )


@dataclass(frozen=True)
class SessionsUnder:
    """Record a new session of `principal_id` only while it has fewer than `limit` live
    ones: counted in the transaction that inserts it (`StoreWrite`), so concurrent
    `initialize`s cannot overshoot (SQLite has one writer; on PostgreSQL a lock per
    principal, held to the commit, orders them). `refused(count)` is what to raise."""

    principal_id: str
    limit: int
    refused: Callable[[int], Exception]

    def write(self, conn: Connection) -> None:
        if conn.dialect.name == "postgresql":
            conn.execute(
                text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                {"key": f"lockgate:sessions:{self.principal_id}"},
            )
        count = int(conn.execute(_live_of(), {"principal_id": self.principal_id}).scalar_one())
        if count >= self.limit:
            raise self.refused(count)


class SessionQueries(Queries):
    def get(self, session_id: str) -> Session | None:
        """The session by id (primary key), in any state."""
        return self._get(Session, session_id)

    def owed(self, owed_id: str) -> OwedRequest | None:
        """One owed-request entry by id (primary key), in any state."""
        return self._get(OwedRequest, owed_id)

    def live_count(self, principal_id: str) -> int:
        """How many of the principal's sessions are live, across instances: what its session
        limit is checked against (index on `sessions.principal_id`)."""
        with self._session() as s:
            return int(s.execute(_live_of(), {"principal_id": principal_id}).scalar_one())

    def live(self) -> list[Session]:
        """Every live session, of every instance: what the lease sweep decides on (index on
        `sessions.status`, so ended sessions are never read)."""
        return self._models(Session, _live())

    def active(self) -> list[Session]:
        """Sessions marked active (a request in flight on them), on whichever incarnation:
        recovery sends those of dead ones idle. Not an `IN` over the dead incarnations:
        those are every start there ever was, past any bound on a statement's parameters."""
        return self._models(Session, _active())

    def owed_here(self, session_id: str, incarnation: int) -> int:
        """How many requests `incarnation` still owes an answer on the session (entries of
        other incarnations never count): one input of the lease decision (index on
        `owed_requests.session_id`)."""
        with self._session() as s:
            count = s.exec(
                _owed_here(), params={"session_id": session_id, "incarnation": incarnation}
            ).one()
        return int(count)

    def of_session(self, session_id: str, *statuses: OwedRequestStatus) -> list[OwedRequest]:
        """The session's ledger entries in one of `statuses` (unordered; callers sort what
        they show): its lost requests to report or abandon, what is still owed on it, or
        both in one read (index on `owed_requests.session_id`)."""
        wanted = {"session_id": session_id}
        wanted.update({f"status_{n}": str(status) for n, status in enumerate(statuses)})
        return self._models(OwedRequest, _of_session(len(statuses)), wanted)

    def all_owed(self) -> list[OwedRequest]:
        """Every entry still owed, whoever owes it: the requests in flight in the whole
        fleet, which recovery sorts by whether their incarnation is dead (index on
        `owed_requests.status`). Not an `IN` over the dead incarnations: those are every
        start there ever was, past any bound on a statement's parameters."""
        return self._models(OwedRequest, _all_owed())

    def lost_of_ended_sessions(self) -> list[OwedRequest]:
        """Lost entries whose session is no longer live, so that no GET will ever collect
        their report: recovery abandons them (index on `owed_requests.status`, joined to
        the session by primary key)."""
        return self._models(OwedRequest, _lost_of_ended_sessions())
