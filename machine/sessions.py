"""Durable MCP sessions: opened, active while a request is in flight here, idle, and
ended by DELETE or by the lease decision (spec/session_lease.py).

The HTTP layer (server/session_gate.py) and the simulator drive the same methods, so the
simulator crashes exactly the code that serves clients. Every status change goes through
the write path; in-memory state is a cache (how many requests are in flight here). What a
session is owed lives in the ledger (machine/ledger.py), which a session's end settles.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from pydantic import JsonValue

from lockgate.machine.db.queries import new_row
from lockgate.machine.db.schema import Session
from lockgate.machine.db.session_queries import LIVE_SESSION_STATUSES, SessionsUnder
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import STALE_WRITE
from lockgate.machine.instances import InstanceLease
from lockgate.machine.ledger import Ledger
from lockgate.machine.records import RowRecord
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import SessionStatus
from lockgate.spec.session_lease import Alarm, LeasePolicy, decide_session_alarm

log = logging.getLogger("lockgate.sessions")


def _record(row: Session) -> RowRecord[Session]:
    return RowRecord.of("session", row)


class SessionLimitReached(Exception):
    """The principal already has its limit of live sessions (the count is `live`)."""

    def __init__(self, live: int) -> None:
        self.live = live
        super().__init__(f"{live} live sessions")


class LiveCounts(Protocol):
    """Running (pending included) and paused executions of a session (`Engine.live_counts`)."""

    def __call__(self, *, session_id: str | None = None) -> dict[str, int]: ...


#: Reads and retries of one close before giving up: each retry means another write to the
#: session succeeded in between, which a session's own requests do only a few times.
CLOSE_ATTEMPTS = 20


class SessionBusy(Exception):
    """A close lost every attempt to concurrent writes: the DELETE must be retried."""


class Sessions:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        lease: InstanceLease,
        policy: LeasePolicy,
        clock: Callable[[], datetime],
        live_counts: LiveCounts,
        ledger: Ledger,
    ) -> None:
        self.store, self.write, self.lease, self.policy = store, write, lease, policy
        self.clock = clock
        #: The engine's count of a session's running and paused executions (the lease
        #: decision needs nothing else of it).
        self.live_counts = live_counts
        #: What the sessions are owed: settled when a session ends.
        self.ledger = ledger
        self._in_flight: dict[str, int] = {}
        #: Each session with requests in flight here, as the first of them left its row
        #: (read, or written active): the last one to end writes from it, and reads the row
        #: again only when that write finds it moved. Kept only while requests are in
        #: flight, so it is bounded by them.
        self._rows: dict[str, Session] = {}
        self._lock = threading.Lock()

    # -- sessions ----------------------------------------------------------------------------

    def get(self, session_id: str) -> Session | None:
        return self.store.sessions.get(session_id)

    def open(
        self,
        session_id: str,
        principal: str,
        protocol_version: str,
        client_info: JsonValue,
        capabilities: JsonValue,
        limit: int | None = None,
    ) -> Session:
        """Record a session whose `initialize` this incarnation is answering (so active).
        With `limit`, only while the principal has fewer live sessions than that, counted in
        the insert's transaction (`SessionLimitReached` otherwise)."""
        now = self.clock()
        row = new_row(
            Session,
            id=session_id,
            principal_id=principal,
            status=SessionStatus.ACTIVE.value,
            protocol_version=protocol_version,
            client_info=client_info,
            capabilities=capabilities,
            incarnation=self.lease.incarnation,
            last_activity=now,
            created_at=now,
        )
        under = [] if limit is None else [SessionsUnder(principal, limit, SessionLimitReached)]
        self.write.create("session", row, writes=under)
        with self._lock:
            self._in_flight[session_id] = 1
        return row

    def begin_request(self, session_id: str, seen: Session | None = None) -> None:
        """A request arrived: the session is active while any is in flight here. `seen` is
        the row as the request's own check read it a moment ago (`live`): when it is idle,
        the write goes from it without reading it again (the write's version check says
        whether it moved since, and then it is read again). Any other state is read again
        first: an active row seen may have gone idle since (the request before this one
        ended), and this request must make it active again."""
        with self._lock:
            count = self._in_flight.get(session_id, 0)
            self._in_flight[session_id] = count + 1
        if count:
            return
        idle = seen is not None and seen.status == SessionStatus.IDLE
        row = seen if idle else self.get(session_id)
        while row is not None and row.status == SessionStatus.IDLE:
            try:
                self.write.apply(
                    Step(
                        _record(row), "begin_request", data={"incarnation": self.lease.incarnation}
                    )
                )
                break  # the write left `row` as it stored it: active, one version on
            except STALE_WRITE:
                if row is not seen:
                    # Moved between this read and the write: another request or instance
                    # recorded activity; it is active, or no longer live.
                    return
                row = self.get(session_id)
        if row is not None:
            with self._lock:
                self._rows[session_id] = row

    def end_request(self, session_id: str) -> None:
        with self._lock:
            count = self._in_flight.get(session_id, 1) - 1
            if count > 0:
                self._in_flight[session_id] = count
                return
            self._in_flight.pop(session_id, None)
            known = self._rows.pop(session_id, None)
        if known is not None and known.status == SessionStatus.ACTIVE:
            try:
                self.write.apply(Step(_record(known), "end_request"))
                return
            except STALE_WRITE:
                pass  # moved since (another instance, a log level set): read it again
        row = self.get(session_id)
        if row is None or row.status != SessionStatus.ACTIVE:
            return
        with contextlib.suppress(*STALE_WRITE):
            self.write.apply(Step(_record(row), "end_request"))

    def close(self, session_id: str) -> bool:
        """DELETE: the session ends; its executions are untouched. Whether this call closed
        it (False: it was not live).

        A write that lands between reading the row and closing it (the previous request's
        `end_request`, another instance's activity) makes the close stale; it is read again
        and applied again, never dropped: a DELETE answered 200 while the row stayed live
        would let the next request revive the session."""
        for _ in range(CLOSE_ATTEMPTS):
            row = self.get(session_id)
            if row is None or row.status not in LIVE_SESSION_STATUSES:
                return False
            try:
                self.write.apply(
                    Step(_record(row), "close"), *self.ledger.abandon_steps(session_id)
                )
            except STALE_WRITE:
                continue  # someone else's write came first: close what is there now
            return True
        raise SessionBusy(session_id)

    def set_log_level(self, session_id: str, level: str) -> bool:
        """logging/setLevel: the least severe notices the session's client wants, kept on its
        row for every instance. Whether it was kept (False: the session is not live). Like
        a close, a write that lands first is read again and the level applied again."""
        for _ in range(CLOSE_ATTEMPTS):
            row = self.get(session_id)
            if row is None or row.status not in LIVE_SESSION_STATUSES:
                return False
            try:
                self.write.apply(Step(_record(row), "set_log_level", given={"log_level": level}))
            except STALE_WRITE:
                continue
            return True
        raise SessionBusy(session_id)

    def live(self, session_id: str) -> Session | None:
        """The session if it is live now. One past its idle timeout (or its cap) is expired
        here, at the moment of use, rather than served until the next sweep (up to the
        sweep interval late)."""
        row = self.get(session_id)
        if row is None or row.status not in LIVE_SESSION_STATUSES:
            return None
        now = self.clock()
        # The common case, decided without reading counts: a session the lease keeps with no
        # work at all is kept with any (the counts only choose between extend and destroy).
        if decide_session_alarm(now, row.last_activity, 0, 0, 0, self.policy).alarm is Alarm.KEEP:
            return row
        if self._destroy_if_due(row, now):
            return None
        # Kept (running work extends it), or someone else's write came first: as it is now.
        row = self.get(session_id)
        return row if row is not None and row.status in LIVE_SESSION_STATUSES else None

    def live_count(self, principal_id: str) -> int:
        """The principal's live sessions, across instances (for its session limit)."""
        return self.store.sessions.live_count(principal_id)

    # -- the lease -----------------------------------------------------------------------------

    def _owed_here(self, session_id: str) -> int:
        """Requests this incarnation still owes on the session (stale rows never count)."""
        return self.store.sessions.owed_here(session_id, self.lease.incarnation)

    def sweep(self) -> list[str]:
        """Apply the lease decision to every live session; returns the destroyed ids."""
        rows = self.store.sessions.live()
        destroyed = []
        now = self.clock()
        for row in rows:
            if self._destroy_if_due(row, now):
                destroyed.append(row.id)
        return destroyed

    def _destroy_if_due(self, row: Session, now: datetime) -> bool:
        """Apply the lease decision to one session; whether this call destroyed it."""
        counts = self.live_counts(session_id=row.id)
        decision = decide_session_alarm(
            now,
            row.last_activity,
            counts["running"],
            counts["paused"],
            self._owed_here(row.id),
            self.policy,
        )
        if decision.alarm is not Alarm.DESTROY:
            return False
        try:
            self.write.apply(
                Step(_record(row), "destroy", {"lease_decision": decision.alarm.value}),
                *self.ledger.abandon_steps(row.id),
            )
        except STALE_WRITE:
            return False  # another instance destroyed it, or a request touched it, first
        return True

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> int:
        """Sessions left active by a dead incarnation go idle; what it owed is lost (to be
        reported on the session's next GET). Returns the sessions and entries moved."""
        active = self.store.sessions.active()
        dead = self.lease.dead_among({row.incarnation for row in active})
        released = 0
        for row in (row for row in active if row.incarnation in dead):
            try:
                self.write.apply(Step(_record(row), "release"))
                released += 1
            except STALE_WRITE:
                continue
        return released + self.ledger.recover()
