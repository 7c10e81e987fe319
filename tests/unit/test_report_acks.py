"""A lost request's -32010 reaches the client once: the client's `Last-Event-ID`
acknowledges the reports it read, so a report written just before the server could record
it (a crash, a client gone mid-response) is settled, not written again.

These drive the real `SessionGate` over ASGI on a real runtime and database; the first GET's
connection breaks right after the client received a report, before the gate recorded it —
the window a SIGKILL leaves.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

import anyio

from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.ledger import MAX_REPORTS_PER_RESPONSE
from lockgate.machine.runtime import Runtime
from lockgate.server.owed_response import DrainSignal
from lockgate.server.session_gate import SessionGate
from tests.support.servers import run
from tests.support.sessions import opened, owed_status
from tests.support.sse import sse_messages

_ID = re.compile(r"^id: ([^\r\n]*)", re.MULTILINE)


class ConnectionBroke(Exception):
    """The client's connection broke (the server died) right after an event was sent."""


def _lost(runtime: Runtime, session_id: str, request_id: int) -> str:
    owed = runtime.ledger.owe(session_id, request_id, "tools/call", None)
    runtime.ledger.lose(owed)
    return owed.id


async def _listening(scope: Any, receive: Any, send: Any) -> None:
    """Stands for the SDK's listening stream behind the gate: opens and ends at once."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class Get:
    """One GET on session `s` through the gate: what it wrote, the event ids it carried."""

    def __init__(self, runtime: Runtime, last_event_id: str | None = None) -> None:
        self.gate = SessionGate(
            _listening, runtime.sessions, deadline=60, drain=DrainSignal(), held=lambda _: True
        )
        headers = [(b"mcp-session-id", b"s")]
        if last_event_id is not None:
            headers.append((b"last-event-id", last_event_id.encode()))
        self.scope = {
            "type": "http",
            "method": "GET",
            "path": "/mcp",
            "headers": headers,
            "state": {"principal": "alice"},
        }
        self.body = b""
        self.break_after_events: int | None = None

    async def _receive(self) -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    async def _send(self, message: Any) -> None:
        if message["type"] != "http.response.body":
            return
        self.body += message.get("body", b"")
        if self.break_after_events is not None and len(self.ids) >= self.break_after_events:
            raise ConnectionBroke

    @property
    def ids(self) -> list[str]:
        return _ID.findall(self.body.decode())

    @property
    def reported(self) -> list[Any]:
        return [m["id"] for m in sse_messages(self.body) if "error" in m]

    def __call__(self) -> Get:
        async def go() -> None:
            with contextlib.suppress(ConnectionBroke):
                await self.gate(self.scope, self._receive, self._send)

        run(go())
        return self


def test_a_report_the_client_received_is_not_written_again_after_its_connection_broke(
    make_runtime: Callable[..., Runtime],
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    first, second = _lost(runtime, "s", 1), _lost(runtime, "s", 2)

    broken = Get(runtime)
    broken.break_after_events = 2  # both written; the second never recorded as reported
    broken()
    assert broken.reported == [1, 2]
    assert (owed_status(runtime, first), owed_status(runtime, second)) == ("reported", "lost")

    # The client reconnects from the last event it read: nothing is written twice.
    again = Get(runtime, last_event_id=broken.ids[-1])()
    assert again.reported == []
    assert owed_status(runtime, second) == "reported"


def test_without_the_acknowledgement_the_unrecorded_report_is_written_again(
    make_runtime: Callable[..., Runtime],
) -> None:
    """The control: a client that did not get the report (its last event id is older)
    gets it on its next GET: acknowledging never loses a report."""
    runtime = make_runtime()
    opened(runtime, "s")
    _lost(runtime, "s", 1)
    second = _lost(runtime, "s", 2)
    broken = Get(runtime)
    broken.break_after_events = 1  # the first arrived; the second was never written
    broken()
    assert broken.reported == [1]
    again = Get(runtime, last_event_id=broken.ids[-1])()
    assert again.reported == [2]
    assert owed_status(runtime, second) == "reported"


def test_an_acknowledgement_naming_someone_elses_report_settles_nothing(
    make_runtime: Callable[..., Runtime],
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    opened(runtime, "t", principal="bob")
    bobs = _lost(runtime, "t", 7)
    forged = f"_GET_stream:r{bobs}"
    Get(runtime, last_event_id=forged)()
    assert owed_status(runtime, bobs) == "lost"  # still bob's to collect, on his session


def test_one_response_carries_a_bounded_number_of_reports_and_the_rest_follow(
    make_runtime: Callable[..., Runtime],
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    ids = [_lost(runtime, "s", n) for n in range(MAX_REPORTS_PER_RESPONSE + 3)]
    first = Get(runtime)()
    assert len(first.reported) == MAX_REPORTS_PER_RESPONSE
    rest = Get(runtime, last_event_id=first.ids[-1])()
    assert sorted(first.reported + rest.reported) == list(range(len(ids)))
    with runtime.sessions.store.session() as s:
        statuses = {s.get(OwedRequest, i).status for i in ids}  # type: ignore[union-attr]
    assert statuses == {"reported"}
