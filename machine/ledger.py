"""The owed-request ledger: every request a session is owed an answer to, until it is
answered or its loss (-32010) is reported to the client.

Entries move only through the write path. The HTTP layer (server/session_gate.py,
server/owed_response.py) and the simulator drive these same methods, so the simulator
crashes exactly the code that serves clients. What the -32010 says about the request's
execution is written in machine/lost_report.py.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine.db.queries import new_row
from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.db.session_queries import LIVE_SESSION_STATUSES
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import STALE_WRITE
from lockgate.machine.instances import InstanceLease
from lockgate.machine.lost_report import lost_error, request_key
from lockgate.machine.records import Record, RowRecord
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import OwedRequestStatus

#: Reports written in one response at most; the rest go on the client's next GET. It bounds
#: the acknowledgement a report's event id carries (each id names every report before it).
MAX_REPORTS_PER_RESPONSE = 8
#: Marks an event id token as a report acknowledgement: `<stream>:r<owed id>.<owed id>...`.
REPORT_TOKEN = "r"

#: An owed request as the write path moves it, with its typed row.
OwedRecord = RowRecord[OwedRequest]


def _record(row: OwedRequest) -> OwedRecord:
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


class Ledger:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        lease: InstanceLease,
        clock: Callable[[], datetime],
        recover_executions: Callable[[], object] = lambda: None,
    ) -> None:
        self.store, self.write, self.lease, self.clock = store, write, lease, clock
        #: Recovery of dead instances' executions, run before a report describes their fate.
        self.recover_executions = recover_executions

    def get(self, owed_id: str) -> OwedRequest | None:
        return self.store.sessions.owed(owed_id)

    # -- one request's entry -------------------------------------------------------------------

    def owe(
        self, session_id: str, request_id: JsonValue, method: str, execution_id: str | None
    ) -> OwedRecord:
        """Record that this incarnation owes an answer to `request_id` on the session."""
        row = new_row(
            OwedRequest,
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

    def answered(self, owed: OwedRecord, write_response: Callable[[], object]) -> None:
        """Write the response (`write_response`, the transition's effect), then consume the
        entry: never the other way round, or a crash between the two would leave the client
        with neither its answer nor a -32010 for it."""
        with contextlib.suppress(*STALE_WRITE):
            self.write.apply(Step(owed, "answer"), effect=write_response)

    def lose(self, owed: OwedRecord) -> None:
        """No answer will come on this stream (closed, deadline passed, draining). If its
        session already ended (a DELETE while the request ran), nobody can collect the
        report: it is abandoned at once (a crash in between leaves it to recovery)."""
        with contextlib.suppress(*STALE_WRITE):
            self.write.apply(Step(owed, "lose"))
            session = self.store.sessions.get(owed.typed.session_id)
            if session is not None and session.status not in LIVE_SESSION_STATUSES:
                self.write.apply(Step(owed, "abandon", {"session_ended": True}))

    def reported(self, lost: OwedRecord) -> None:
        """The -32010 error was written: the entry is settled."""
        with contextlib.suppress(*STALE_WRITE):
            self.write.apply(Step(lost, "report"), effect=lambda: True)

    def lost_error(self, row: OwedRequest) -> dict[str, JsonValue]:
        """The -32010 error for a lost request, telling what became of its execution."""
        if row.execution_id is not None:
            execution = self.store.executions.get(row.execution_id)
        else:
            execution = self.store.executions.by_origin(request_key(row.session_id, row.request_id))
        return lost_error(row, execution)

    # -- a session's entries -------------------------------------------------------------------

    def acknowledge(self, session_id: str, owed_ids: list[str]) -> int:
        """The client says it received these reports (the event id it resumes from names
        them), so they are settled without being written again: a report is received once
        even when the server died between writing it and recording that it did. Ids that are
        not a lost request of this session are ignored (a guess tells nothing)."""
        wanted = set(owed_ids)
        settled = 0
        for row in self._rows(session_id, OwedRequestStatus.LOST):
            if row.id in wanted:
                with contextlib.suppress(*STALE_WRITE):
                    self.write.apply(Step(_record(row), "report"), effect=lambda: True)
                    settled += 1
        return settled

    def abandon_steps(self, session_id: str) -> list[Step]:
        """Reports nobody can collect once the session ends: settled in the same transaction
        that ends it, so a crash cannot leave them waiting for a GET that will never come."""
        return [
            Step(_record(row), "abandon", {"session_ended": True})
            for row in self._rows(session_id, OwedRequestStatus.LOST)
        ]

    def _rows(self, session_id: str, *statuses: OwedRequestStatus) -> list[OwedRequest]:
        return self.store.sessions.of_session(session_id, *statuses)

    def lost_reports(
        self, session_id: str, stream: str | None = None
    ) -> list[tuple[OwedRecord, dict[str, JsonValue]]]:
        """Entries of the session to report now, each with its JSON-RPC error body (only the
        request whose response stream is `stream`, when given). Entries still owed by a dead
        incarnation are declared lost first (the GET may arrive before the periodic
        recovery runs).

        Every request of a 2025 session asks (its notices), so the common case is one read
        of the session's own unsettled entries: the leases of the incarnations holding them
        are read only when another incarnation holds one (every incarnation that ever ran
        stays a row, and reading them all at every request would cost more with each
        restart)."""
        unsettled = self._rows(session_id, OwedRequestStatus.OWED, OwedRequestStatus.LOST)
        if self._lose(self._orphans_among(unsettled)):
            unsettled = self._rows(session_id, OwedRequestStatus.LOST)
        rows = [row for row in unsettled if row.status == OwedRequestStatus.LOST]
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

    def _orphans_among(self, rows: list[OwedRequest]) -> list[OwedRequest]:
        """Those of `rows` still owed by a dead incarnation (which will never answer them)."""
        owed = [row for row in rows if row.status == OwedRequestStatus.OWED]
        dead = self.lease.dead_among({row.incarnation for row in owed})
        return [row for row in owed if row.incarnation in dead]

    def _lose(self, orphans: list[OwedRequest]) -> int:
        lost = 0
        for row in orphans:
            try:
                self.write.apply(Step(_record(row), "lose_in_crash"))
                lost += 1
            except STALE_WRITE:
                continue
        return lost

    def recover(self) -> int:
        """What dead incarnations owed is lost (to be reported on the session's next GET);
        reports of sessions that ended are abandoned. Returns the entries moved."""
        orphans = self._orphans_among(self.store.sessions.all_owed())
        return self._lose(orphans) + self._abandon_ended()

    def _abandon_ended(self) -> int:
        """Lost reports of sessions that ended: nobody can collect them any more. A session
        ending abandons its reports in its own transaction, but an id can still be lost
        afterwards (its incarnation died after the session expired), so recovery looks too."""
        abandoned = 0
        for row in self.store.sessions.lost_of_ended_sessions():
            with contextlib.suppress(*STALE_WRITE):
                self.write.apply(Step(_record(row), "abandon_on_crash", {"session_ended": True}))
                abandoned += 1
        return abandoned
