"""Durable MCP sessions and the owed-request ledger: the step-function core.

The HTTP layer (server/session_gate.py) and the simulator drive the same methods, so the
simulator crashes exactly the code that serves clients. Every status change goes through
the write path; in-memory state is a cache (how many requests are in flight here).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Protocol, overload

from pydantic import JsonValue

from lockgate.machine.db.schema import Execution, OwedRequest, Session
from lockgate.machine.db.session_queries import LIVE_SESSION_STATUSES
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.instances import InstanceLease
from lockgate.machine.records import Record, RowRecord
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import INSTANCE, OwedRequestStatus, SessionStatus
from lockgate.spec import ExecutionStatus as E
from lockgate.spec.session_lease import Alarm, LeasePolicy, decide_session_alarm

log = logging.getLogger("lockgate.sessions")

#: JSON-RPC code of "the server lost this request" (implementation-defined range).
REQUEST_LOST = -32010
#: Reports written in one response at most; the rest go on the client's next GET. It bounds
#: the acknowledgement a report's event id carries (each id names every report before it).
MAX_REPORTS_PER_RESPONSE = 8
#: Marks an event id token as a report acknowledgement: `<stream>:r<owed id>.<owed id>...`.
REPORT_TOKEN = "r"
_STALE = (Conflict, GuardRefused, IllegalTransition)


#: An owed request as the write path moves it, with its typed row.
OwedRecord = RowRecord[OwedRequest]


@overload
def _record(row: Session) -> RowRecord[Session]: ...
@overload
def _record(row: OwedRequest) -> OwedRecord: ...
def _record(row: Session | OwedRequest) -> RowRecord[Session] | OwedRecord:
    if isinstance(row, Session):
        return RowRecord.of("session", row)
    return RowRecord.of("owed_request", row)


def report_event_ids(stream: str, reports: list[Record]) -> list[str]:
    """The SSE event id of each report written in one response, in order. Each id names
    every report of the response up to and including its own, so the `Last-Event-ID` a
    client sends when it reconnects acknowledges exactly the reports it received."""
    ids: list[str] = []
    names: list[str] = []
    for record in reports:
        names.append(record.id)
        ids.append(f"{stream}:{REPORT_TOKEN}{'.'.join(names)}")
    return ids


def acknowledged_reports(event_id: str | None) -> tuple[str, list[str]] | None:
    """(stream, owed ids) when `event_id` is a report's event id (see `report_event_ids`),
    else None."""
    if not event_id:
        return None
    stream, _, token = event_id.rpartition(":")
    if not stream or not token.startswith(REPORT_TOKEN):
        return None
    names = token[len(REPORT_TOKEN) :].split(".")
    if (
        not names
        or len(names) > MAX_REPORTS_PER_RESPONSE
        or not all(len(n) == 32 and all(ch in "0123456789abcdef" for ch in n) for n in names)
    ):
        return None
    return stream, names


def request_key(session_id: str, request_id: JsonValue) -> str:
    """One id for (session, JSON-RPC id): numbers and strings stay distinct."""
    return f"{session_id}:{request_id!r}"


class LiveCounts(Protocol):
    """Running (pending included) and paused executions of a session (`Engine.live_counts`)."""

    def __call__(self, *, session_id: str | None = None) -> dict[str, int]: ...


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
        recover_executions: Callable[[], object] = lambda: None,
    ) -> None:
        self.store, self.write, self.lease, self.policy = store, write, lease, policy
        self.clock = clock
        #: The engine's count of a session's running and paused executions (the lease
        #: decision needs nothing else of it).
        self.live_counts = live_counts
        #: Recovery of dead instances' executions, run before a report describes their fate.
        self.recover_executions = recover_executions
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- sessions ----------------------------------------------------------------------------

    def get(self, session_id: str) -> Session | None:
        return self.store.sessions.get(session_id)

    def get_owed(self, owed_id: str) -> OwedRequest | None:
        return self.store.sessions.owed(owed_id)

    def open(
        self,
        session_id: str,
        principal: str,
        protocol_version: str,
        client_info: JsonValue,
        capabilities: JsonValue,
    ) -> Session:
        """Record a session whose `initialize` this incarnation is answering (so active)."""
        now = self.clock()
        row = Session(
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
        self.write.create("session", row)
        with self._lock:
            self._in_flight[session_id] = 1
        return row

    def begin_request(self, session_id: str) -> None:
        """A request arrived: the session is active while any is in flight here."""
        with self._lock:
            count = self._in_flight.get(session_id, 0)
            self._in_flight[session_id] = count + 1
        if count:
            return
        row = self.get(session_id)
        if row is None or row.status != SessionStatus.IDLE:
            return
        # Another request or instance may have moved it; activity is recorded either way.
        with contextlib.suppress(*_STALE):
            self.write.apply(
                Step(_record(row), "begin_request", data={"incarnation": self.lease.incarnation})
            )

    def end_request(self, session_id: str) -> None:
        with self._lock:
            count = self._in_flight.get(session_id, 1) - 1
            if count > 0:
                self._in_flight[session_id] = count
                return
            self._in_flight.pop(session_id, None)
        row = self.get(session_id)
        if row is None or row.status != SessionStatus.ACTIVE:
            return
        with contextlib.suppress(*_STALE):
            self.write.apply(Step(_record(row), "end_request"))

    def close(self, session_id: str) -> bool:
        """DELETE: the session ends; its executions are untouched."""
        row = self.get(session_id)
        if row is None or row.status not in LIVE_SESSION_STATUSES:
            return False
        try:
            self.write.apply(Step(_record(row), "close"), *self._abandon_steps(session_id))
        except _STALE:
            return False
        return True

    def live(self, session_id: str) -> Session | None:
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
                continue
            try:
                self.write.apply(
                    Step(_record(row), "destroy", {"lease_decision": decision.alarm.value}),
                    *self._abandon_steps(row.id),
                )
            except _STALE:
                continue
            destroyed.append(row.id)
        return destroyed

    # -- the ledger ----------------------------------------------------------------------------

    def owe(
        self, session_id: str, request_id: JsonValue, method: str, execution_id: str | None
    ) -> OwedRecord:
        """Record that this incarnation owes an answer to `request_id` on the session."""
        row = OwedRequest(
            id=uuid.uuid4().hex,
            session_id=session_id,
            request_id=request_id,
            method=method,
            status=OwedRequestStatus.OWED.value,
            incarnation=self.lease.incarnation,
            execution_id=execution_id,
            created_at=self.clock(),
        )
        self.write.create("owed_request", row)
        return _record(row)

    def answered(self, owed: OwedRecord) -> None:
        """The response was written: consume the entry (effect first, then the commit)."""
        with contextlib.suppress(*_STALE):
            self.write.apply(Step(owed, "answer"), effect=lambda: True)

    def lose(self, owed: OwedRecord) -> None:
        """No answer will come on this stream (closed, deadline passed, draining). If its
        session already ended (a DELETE while the request ran), nobody can collect the
        report: it is abandoned at once (a crash in between leaves it to recovery)."""
        with contextlib.suppress(*_STALE):
            self.write.apply(Step(owed, "lose"))
            session = self.get(owed.typed.session_id)
            if session is not None and session.status not in LIVE_SESSION_STATUSES:
                self.write.apply(Step(owed, "abandon", {"session_ended": True}))

    def reported(self, lost: OwedRecord) -> None:
        """The -32010 error was written: the entry is settled."""
        with contextlib.suppress(*_STALE):
            self.write.apply(Step(lost, "report"), effect=lambda: True)

    def acknowledge(self, session_id: str, owed_ids: list[str]) -> int:
        """The client says it received these reports (the event id it resumes from names
        them), so they are settled without being written again: a report is received once
        even when the server died between writing it and recording that it did. Ids that are
        not a lost request of this session are ignored (a guess tells nothing)."""
        wanted = set(owed_ids)
        settled = 0
        for row in self._rows(session_id, OwedRequestStatus.LOST):
            if row.id in wanted:
                with contextlib.suppress(*_STALE):
                    self.write.apply(Step(_record(row), "report"), effect=lambda: True)
                    settled += 1
        return settled

    def _abandon_steps(self, session_id: str) -> list[Step]:
        """Reports nobody can collect once the session ends: settled in the same transaction
        that ends it, so a crash cannot leave them waiting for a GET that will never come."""
        return [
            Step(_record(row), "abandon", {"session_ended": True})
            for row in self._rows(session_id, OwedRequestStatus.LOST)
        ]

    def _rows(self, session_id: str, status: OwedRequestStatus) -> list[OwedRequest]:
        return self.store.sessions.of_session(session_id, status)

    def lost_reports(
        self, session_id: str, stream: str | None = None
    ) -> list[tuple[OwedRecord, dict[str, JsonValue]]]:
        """Entries of the session to report now, each with its JSON-RPC error body (only the
        request whose response stream is `stream`, when given). Entries still owed by a dead
        incarnation are declared lost first (the GET may arrive before the periodic
        recovery runs)."""
        self._lose_orphans(session_id)
        rows = self._rows(session_id, OwedRequestStatus.LOST)
        if stream is not None:
            rows = [row for row in rows if str(row.request_id) == stream]
        rows = sorted(rows, key=lambda r: (r.created_at, r.id))[:MAX_REPORTS_PER_RESPONSE]
        if rows:
            # Tell the fate recovery gives the execution, not the one it had when its owner
            # died: take over what dead instances left before describing it.
            self.recover_executions()
        return [(_record(row), self.lost_error(row)) for row in rows]

    def still_owed(self, session_id: str, stream: str) -> bool:
        """Whether the request behind a response stream may still be answered (some live
        or not yet recovered incarnation owes it)."""
        return any(
            str(row.request_id) == stream for row in self._rows(session_id, OwedRequestStatus.OWED)
        )

    # -- recovery --------------------------------------------------------------------------------

    def _dead_incarnations(self) -> set[int]:
        """Incarnations that hold no lease any more."""
        now = self.clock()
        alive = INSTANCE.live_names  # live or draining: its lease still counts
        return {
            lease.incarnation
            for lease in self.store.instances.leases()
            if lease.status not in alive or lease.lease_until <= now
        }

    def _lose_orphans(self, session_id: str | None = None) -> int:
        dead = self._dead_incarnations() - {self.lease.incarnation}
        if not dead:
            return 0
        rows = self.store.sessions.owed_by(dead, session_id)
        lost = 0
        for row in rows:
            try:
                self.write.apply(Step(_record(row), "lose_in_crash"))
                lost += 1
            except _STALE:
                continue
        return lost

    def recover(self) -> int:
        """Sessions left active by a dead incarnation go idle; what it owed is lost (to be
        reported on the session's next GET)."""
        dead = self._dead_incarnations() - {self.lease.incarnation}
        released = 0
        if dead:
            for row in self.store.sessions.active_of(dead):
                try:
                    self.write.apply(Step(_record(row), "release"))
                    released += 1
                except _STALE:
                    continue
        return released + self._lose_orphans() + self._abandon_ended()

    def _abandon_ended(self) -> int:
        """Lost reports of sessions that ended: nobody can collect them any more. A session
        ending abandons its reports in its own transaction, but an id can still be lost
        afterwards (its incarnation died after the session expired), so recovery looks too."""
        abandoned = 0
        for row in self.store.sessions.lost_of_ended_sessions():
            with contextlib.suppress(*_STALE):
                self.write.apply(Step(_record(row), "abandon_on_crash", {"session_ended": True}))
                abandoned += 1
        return abandoned

    # -- what became of the request --------------------------------------------------------------

    def _execution_of(self, row: OwedRequest) -> Execution | None:
        if row.execution_id is not None:
            return self.store.executions.get(row.execution_id)
        return self.store.executions.by_origin(request_key(row.session_id, row.request_id))

    def lost_error(self, row: OwedRequest) -> dict[str, JsonValue]:
        """The -32010 error for a lost request: what became of its execution, and what to
        do next. Re-executing is suggested only when nothing ran."""
        execution = self._execution_of(row)
        data: dict[str, JsonValue] = {"requestMethod": row.method}
        if execution is None:
            data["executionId"] = None
            data["next"] = "re-execute"
            data["hint"] = (
                "The server stopped before this request started any execution: nothing ran. "
                "Send it again."
            )
        else:
            status = execution.status
            data["executionId"] = execution.id
            data["status"] = status
            # Not `live_names`: a paused execution is reported as paused, not running.
            if status in (E.PENDING, E.RUNNING):
                data["next"] = "wait"
                data["hint"] = (
                    "The execution was recovered and is running again: call `resume` with this "
                    "executionId and no action to get its result."
                )
            elif status == E.WAITING_FOR_INTERACTION:
                data["next"] = "resume"
                data["hint"] = (
                    "The execution is paused for approval: call `resume` with this executionId "
                    "and action accept, decline or cancel."
                )
            elif status == E.INTERRUPTED:
                data["whatRan"] = execution.what_ran
                data["next"] = "check"
                data["hint"] = (
                    "The execution was interrupted; whatRan names the calls that ran and the "
                    "call in doubt. Check it before running the code again."
                )
            else:
                data["next"] = "fetch"
                data["hint"] = (
                    f"The execution is {status}: call `resume` with this executionId and no "
                    "action to read its outcome."
                )
        return {
            "jsonrpc": "2.0",
            "id": row.request_id,
            "error": {
                "code": REQUEST_LOST,
                "message": "The server lost this request (it restarted or the stream broke) "
                "before answering it.",
                "data": data,
            },
        }
