"""What an MCP client on a persistent session receives: its JSON-RPC view of the ledger.

A client keeps the ids of the requests it sent and has not had an answer to (pending). A
response, or a -32010 "request lost" error, for a pending id resolves it; one for an id that
is not pending is dropped, as the SDKs drop it (the model never sees it). The client also
remembers the event id of the last report it read, and sends it as `Last-Event-ID` when it
opens its collecting GET again, which acknowledges those reports.

`simulation.invariants.client_received` checks this record against the ledger's rows: a
report the ledger settled reached the client; an answered request was never reported; a
report the client acknowledged was never written to it again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pydantic import JsonValue

from lockgate.machine.ledger import Ledger, acknowledged_reports, report_event_ids

#: The stream id the SDK gives a session's listening GET (its events are `<this>:<token>`).
LISTENING_STREAM = "_GET_stream"


@dataclass
class Inbox:
    #: Request id -> what resolved it ("answer" or "lost"), for every request sent.
    resolved: dict[str, str | None] = field(default_factory=dict)
    #: Request id -> how many -32010 errors were written to the client for it (dropped or
    #: not): the same report twice is a duplicate on the wire.
    reports: Counter[str] = field(default_factory=Counter)
    #: Owed-request ids the client acknowledged (named by the event id it resumed from).
    acknowledged: set[str] = field(default_factory=set)
    #: Owed-request ids written to the client again after it acknowledged them.
    rewritten: list[str] = field(default_factory=list)
    last_event_id: str | None = None

    def sent(self, request_id: str) -> None:
        self.resolved.setdefault(request_id, None)

    def answer(self, request_id: str) -> None:
        if self.resolved.get(request_id) is None:
            self.resolved[request_id] = "answer"

    def lost(self, owed_id: str, error: dict[str, JsonValue]) -> None:
        request_id = str(error.get("id"))
        self.reports[request_id] += 1
        if owed_id in self.acknowledged:
            self.rewritten.append(owed_id)
        if request_id in self.resolved and self.resolved[request_id] is None:
            self.resolved[request_id] = "lost"


def collect(inbox: Inbox, ledger: Ledger, session_id: str, stream: str | None = None) -> None:
    """The client's GET on its session (resuming `stream`, a request's own stream, or the
    listening one): it acknowledges what it read last, then reads the reports written to it,
    each followed by the server recording that it wrote it (the order the HTTP gate uses)."""
    acked = acknowledged_reports(inbox.last_event_id)
    if acked is not None:
        ledger.acknowledge(session_id, acked[1])
        inbox.acknowledged.update(acked[1])
        inbox.last_event_id = None
    reports = ledger.lost_reports(session_id, stream)
    ids = report_event_ids(stream or LISTENING_STREAM, [record for record, _ in reports])
    for (record, error), event_id in zip(reports, ids, strict=True):
        inbox.lost(record.id, error)  # written to the wire: the client has it now
        inbox.last_event_id = event_id
        ledger.reported(record)
