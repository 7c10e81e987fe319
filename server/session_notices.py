"""What a session's next request is told: requests it lost, approvals about to expire.

Most clients never open the GET stream that the -32010 reports of lost requests wait on, and
none is asked before an approval it started runs out. So every POST of a 2025 session opens
its SSE response with a `notifications/message` (level `warning`, logger `lockgate`) for:

- each request of the session the server lost, not reported yet (an `execute` whose stream
  broke while the client's prompt was open, or whose server died): the -32010 report's own
  message, naming the execution and what to do next (`data` holds the same facts). The
  ledger entry stays lost, so a GET still collects the JSON-RPC error for that id;
- each paused execution started on the session whose approval expires within
  `LOCKGATE_APPROVAL_WARNING`: when, and how to decide it.

A client that set a level above `warning` (logging/setLevel: `error` and up, kept on the
session's row) is sent none of them.

Both are read from the database as the request arrives, so they reach the session through any
instance after any restart. Each is told once per process (a bounded memory of what was
told); after a restart, or on another instance, the next request is told once more.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import JsonValue

from lockgate.machine.db.schema import Execution, Session
from lockgate.machine.db.store import SqlStore
from lockgate.machine.ledger import Ledger, OwedRecord

log = logging.getLogger("lockgate.ledger")

#: Notices of one kind one response opens with, at most.
MAX_NOTICES = 8
#: What this process remembers having told (the oldest is forgotten first).
MAX_REMEMBERED = 10_000
LOGGER = "lockgate"
#: The syslog severities of `notifications/message`, least severe first (RFC 5424).
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
#: The level of every notice here.
LEVEL = "warning"


#: What tells a request's notices as its response starts (on the event loop: no read).
Notices = Callable[[], list[dict[str, JsonValue]]]


def notification(data: dict[str, JsonValue]) -> dict[str, JsonValue]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": LEVEL, "logger": LOGGER, "data": data},
    }


class SessionNotices:
    def __init__(
        self,
        *,
        store: SqlStore,
        ledger: Ledger,
        warning: timedelta,
        clock: Callable[[], datetime],
    ) -> None:
        self.store, self.ledger, self.warning, self.clock = store, ledger, warning, clock
        self._told: OrderedDict[str, None] = OrderedDict()

    def _first_time(self, key: str) -> bool:
        if key in self._told:
            return False
        self._told[key] = None
        while len(self._told) > MAX_REMEMBERED:
            self._told.popitem(last=False)
        return True

    def for_request(self, session: Session) -> Notices:
        """Read what the session's request is to be told (blocking: run it in a worker
        thread, as the request arrives). `session` is its row as the request's check read it:
        its client's log level, as of the request's arrival. Returns what tells them, as the
        response starts: the notices this process has not told yet (in memory, no read)."""
        if not self._wanted(session):
            return list
        try:
            lost = self.ledger.lost_reports(session.id)
            now = self.clock()
            expiring = (
                self.store.inbox.expiring_in_session(
                    session.id, now, now + self.warning, MAX_NOTICES
                )
                if self.warning > timedelta(0)
                else []
            )
        except Exception:
            # A notice is a courtesy: the request's own answer must not depend on it.
            log.exception("could not read what to tell the session; answering without it")
            return list
        return lambda: self._lost(lost) + self._expiring(expiring, now)

    @staticmethod
    def _wanted(session: Session) -> bool:
        """Whether the session's client takes warnings (it set no level, or one up to them)."""
        level = session.log_level
        return level not in LEVELS or LEVELS.index(level) <= LEVELS.index(LEVEL)

    def _lost(
        self, reports: list[tuple[OwedRecord, dict[str, JsonValue]]]
    ) -> list[dict[str, JsonValue]]:
        told = []
        for record, report in reports:
            if not self._first_time(f"lost:{record.id}"):
                continue
            # The report is the JSON-RPC error message for the lost id: tell its error.
            error = report.get("error")
            if not isinstance(error, dict):
                continue
            facts = error.get("data")
            data: dict[str, JsonValue] = {
                "message": error.get("message"),
                "lostRequestId": report.get("id"),
            }
            if isinstance(facts, dict):
                data.update(facts)
            told.append(notification(data))
        return told

    def _expiring(self, waiting: list[Execution], now: datetime) -> list[dict[str, JsonValue]]:
        told = []
        for ex in waiting:
            if ex.deadline is None or not self._first_time(f"expiring:{ex.id}:{ex.snapshot_call}"):
                continue
            minutes = max(1, round((ex.deadline - now).total_seconds() / 60))
            message = (
                f"The approval execution {ex.id} waits for expires at {ex.deadline.isoformat()} "
                f"(in about {minutes} min); without a decision the execution ends expired. Call "
                f"`resume` with executionId={ex.id} and no action to see the call and how to "
                "approve it."
            )
            told.append(
                notification(
                    {
                        "message": message,
                        "executionId": ex.id,
                        "status": ex.status,
                        "expiresAt": ex.deadline.isoformat(),
                        "next": "resume",
                    }
                )
            )
        return told
