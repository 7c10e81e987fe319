"""The owed-request ledger, in process: every request a POST owes is answered, or reported
lost (-32010) with what became of its execution.

The real application (`server.app.create_app`) through ASGI, or the `Sessions` core with a
fake clock: the happy path byte for byte what it is without the ledger, stale ledger rows
never extending a session lease, and the races and bugs the real-process tests found
(`test_ledger_processes.py`), pinned here: two concurrent GETs, a resuming GET's own
stream, a stream nobody can replay, a report after a lease lapse, a heartbeat racing the
drain, an expired session.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import httpx2
import pytest

from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.lost_report import request_key
from lockgate.machine.runtime import Runtime
from lockgate.server.owed_response import DrainSignal
from lockgate.server.session_gate import SessionGate
from lockgate.spec import CrashPoint
from lockgate.spec import ExecutionStatus as E
from tests.support.servers import run
from tests.support.sessions import (
    PROTOCOL,
    URL,
    FakeClock,
    eventually,
    headers,
    key_for,
    opened,
    raw_initialize,
    serving,
)
from tests.support.sse import sse_messages

# -- in process: the application through ASGI ------------------------------------------------


#: Inherently per run: the session id the server picks (uuid4) and SSE event ids (a
#: process-wide counter). Nothing else is normalised.
_EVENT_ID = re.compile(rb"^id: [^\r\n]*", re.MULTILINE)


def normalised(response: httpx2.Response, session_id: str | None) -> tuple[Any, ...]:
    body = _EVENT_ID.sub(b"id: <event>", response.content)
    sent = [(k, v) for k, v in response.headers.multi_items()]
    if session_id is not None:
        body = body.replace(session_id.encode(), b"<session>")
        sent = [(k, v.replace(session_id, "<session>")) for k, v in sent]
    return response.status_code, sent, body


async def conversation(http: httpx2.AsyncClient, key: str) -> list[tuple[Any, ...]]:
    """One 2025 session's happy path, raw: every response, normalised."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "bytes", "version": "1"},
        },
    }
    opened = await http.post(URL, headers=headers(key), json=initialize)
    session_id = opened.headers["mcp-session-id"]
    said = [normalised(opened, session_id)]
    for message in (
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": "three",
            "method": "tools/call",
            "params": {"name": "describe_tools", "arguments": {"query": "notes"}},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "ping"},
        {"jsonrpc": "2.0", "id": 5, "method": "no/such/method"},
    ):
        answer = await http.post(URL, headers=headers(key, session_id), json=message)
        said.append(normalised(answer, session_id))
    return said


def test_the_happy_path_is_byte_for_byte_what_it_is_without_the_ledger(
    make_runtime: Callable[..., Runtime],
) -> None:
    """The same conversation through the real application, once as built (SessionGate in
    front of the SDK transport) and once with the gate taken out of the very same app: the
    statuses, headers and bodies are identical, once the session id and SSE event ids (both
    inherently per run) are normalised.

    create_app has no switch to build the app without the ledger, so the second run swaps
    the gate out of the auth layer's `app` attribute (reported to the lead)."""
    runtime = make_runtime()
    key = key_for(runtime, "alice")

    async def scenario() -> None:
        async with serving(runtime) as (http, auth):
            with_ledger = await conversation(http, key)
            gate = auth.app
            assert isinstance(gate, SessionGate)
            auth.app = gate.app  # the SDK's transport, as it is behind the gate
            try:
                without = await conversation(http, key)
            finally:
                auth.app = gate
        assert with_ledger == without
        # And the ledger did its work on the first run: every owed id answered.
        owed = _owed_rows(runtime)
        assert {row.status for row in owed} == {"answered"}, owed
        assert sorted(str(row.request_id) for row in owed) == ["2", "4", "5", "three"]
        # The conversation had substance (not two identical failures).
        status, _, body = with_ledger[3]
        assert status == 200 and b"tools.notes.write" in body

    run(scenario())


def _owed_rows(runtime: Runtime) -> list[OwedRequest]:
    from sqlmodel import select

    with runtime.engine.store.session() as s:
        return list(s.exec(select(OwedRequest)))


# -- in process: the lease and the ledger's core -------------------------------------------


def test_stale_ledger_rows_never_extend_a_session_lease(
    make_runtime: Callable[..., Runtime],
) -> None:
    """A request owed by a previous incarnation (the process died owing it) does not keep a
    session alive: past the idle timeout the sweep destroys the session. A request the
    current incarnation owes extends it (bounded by the cap)."""
    clock = FakeClock()
    limits = {"session_idle_timeout": "60", "session_lease": "60", "session_cap": "600"}
    before = make_runtime(clock=clock, instance_name="a", **limits)
    opened(before, "stale")
    before.sessions.begin_request("stale")
    before.ledger.owe("stale", 7, "tools/call", None)  # ... and the process dies owing it

    after = make_runtime(clock=clock, instance_name="a", **limits)  # the restart
    assert after.lease.incarnation > before.lease.incarnation
    opened(after, "current")
    after.sessions.begin_request("current")
    after.ledger.owe("current", 8, "tools/call", None)
    opened(after, "quiet")

    clock.advance(timedelta(seconds=30))
    assert after.sessions.sweep() == []  # within the idle timeout: kept

    clock.advance(timedelta(seconds=60))
    destroyed = after.sessions.sweep()
    assert sorted(destroyed) == ["quiet", "stale"]
    stale = after.sessions.get("stale")
    assert stale is not None and stale.status == "expired"
    current = after.sessions.get("current")
    assert current is not None and current.status == "active"

    clock.advance(timedelta(seconds=600))  # past the cap: owed or not, it ends
    assert after.sessions.sweep() == ["current"]


# -- races and bugs found by the real-process tests, pinned in process ----------------------


def test_two_concurrent_gets_report_a_lost_id_once(
    make_runtime: Callable[..., Runtime],
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    owed = runtime.ledger.owe("s", 9, "tools/call", None)
    runtime.ledger.lose(owed)
    first_started = anyio.Event()
    release_first = anyio.Event()
    second_done = anyio.Event()

    async def held_inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    gate = SessionGate(
        held_inner, runtime.sessions, deadline=60, drain=DrainSignal(), held=lambda _: True
    )
    written: list[list[bytes]] = [[], []]

    def scope() -> dict[str, Any]:
        return {
            "type": "http",
            "method": "GET",
            "path": "/mcp",
            "headers": [(b"mcp-session-id", b"s")],
            "state": {"principal": "alice"},
        }

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    def sender(index: int) -> Callable[[Any], Any]:
        async def send(message: Any) -> None:
            if message["type"] == "http.response.body":
                written[index].append(message.get("body", b""))
            if index == 0 and message["type"] == "http.response.start":
                first_started.set()
                await release_first.wait()  # the first GET is slow to write

        return send

    async def second_get() -> None:
        await gate(scope(), receive, sender(1))
        second_done.set()

    async def scenario() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(gate, scope(), receive, sender(0))
            await first_started.wait()  # the first GET is writing its report, slowly
            group.start_soon(second_get)
            # The buggy gate answers the second GET at once; a correct one may hold it
            # until the first is done (then this bounded wait runs out), or answer it
            # without the report.
            with anyio.move_on_after(0.5):
                await second_done.wait()
            release_first.set()
        reports = [m for chunks in written for m in sse_messages(b"".join(chunks)) if "error" in m]
        assert len(reports) == 1, reports

    run(scenario())


def test_a_resuming_get_reports_only_its_own_stream(
    make_runtime: Callable[..., Runtime],
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    for request_id in (5, 6):
        runtime.ledger.lose(runtime.ledger.owe("s", request_id, "tools/call", None))

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    gate = SessionGate(
        inner, runtime.sessions, deadline=60, drain=DrainSignal(), held=lambda _: True
    )
    written: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            written.append(message.get("body", b""))

    async def scenario() -> None:
        # The SDK's event ids are "<stream>:<n>", and a POST's stream is its request id.
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/mcp",
            "headers": [(b"mcp-session-id", b"s"), (b"last-event-id", b"5:3")],
            "state": {"principal": "alice"},
        }
        await gate(scope, receive, send)
        reported = [m["id"] for m in sse_messages(b"".join(written))]
        assert reported == [5], reported

    run(scenario())


def test_a_resuming_get_for_a_stream_nobody_can_replay_is_not_an_empty_stream(
    make_runtime: Callable[..., Runtime],
) -> None:
    runtime = make_runtime()
    key = key_for(runtime, "alice")

    async def scenario() -> None:
        async with serving(runtime) as (http, _):
            session_id = await raw_initialize(http, URL, key)
            resuming = headers(key, session_id, Accept="text/event-stream")
            resuming["Last-Event-ID"] = "7:3"  # request 7's stream, from before a restart
            async with http.stream("GET", URL, headers=resuming) as response:
                body = None
                with anyio.move_on_after(2):  # a stream kept open is no reconnect loop
                    body = await response.aread()
            assert not (response.status_code == 200 and body == b""), (
                "an empty stream that ended at once: the client reconnects to it forever"
            )

    run(scenario())


def test_a_report_after_a_lease_lapse_tells_the_recovered_fate(
    make_runtime: Callable[..., Runtime],
) -> None:
    clock = FakeClock()
    common = {"policy": "notes.write=approve", "lease_ttl": "1"}
    write_ran = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_effect")
    a = make_runtime(clock=clock, instance_name="a", faults=Faults([write_ran]), **common)
    opened(a, "s")
    a.sessions.begin_request("s")
    a.ledger.owe("s", 3, "tools/call", None)
    code = "tools.notes.write(key='k', text='v')\n'written'"
    with pytest.raises(InjectedCrash):  # a "dies" after the write's effect
        a.engine.execute("alice", code, "s", request_key("s", 3))
    clock.advance(timedelta(seconds=5))  # a's lease lapsed; b has not run recovery yet
    b = make_runtime(clock=clock, instance_name="b", **common)

    [(_, error)] = b.ledger.lost_reports("s")  # the client's GET lands on b
    body: Any = error["error"]
    data: dict[str, Any] = body["data"]
    b.maintain()  # b's next maintenance round recovers a's work
    [execution] = [row for row in _executions(b) if row.session_id == "s"]
    assert execution.status == E.INTERRUPTED
    assert data["status"] == E.INTERRUPTED, data  # the report said what recovery decided


class DrainDuringHeartbeat(Faults):
    """SIGTERM's drain (on the lifespan's thread) lands while the maintenance thread's
    heartbeat is between reading the lease record and committing: deterministically, from
    the heartbeat's own before-commit point. The drain gets a moment to finish first, as
    it does when the race is lost; a lease that serialises its writes makes it wait."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime: Runtime | None = None
        self.drainer: threading.Thread | None = None

    def reached(self, point: CrashPoint) -> None:
        super().reached(point)
        runtime, self.runtime = self.runtime, None
        if runtime is not None and point.name == "instance:heartbeat:live->live:before_commit":
            self.drainer = threading.Thread(target=runtime.drain, name="lifespan")
            self.drainer.start()
            self.drainer.join(timeout=0.5)


def test_a_heartbeat_racing_the_drain_still_ends_stopped(
    make_runtime: Callable[..., Runtime],
) -> None:
    faults = DrainDuringHeartbeat()
    runtime = make_runtime(faults=faults)
    instance_id = runtime.lease.id
    faults.runtime = runtime
    runtime.maintain(sweep=False)  # the heartbeat, with the drain landing inside it
    assert faults.drainer is not None
    faults.drainer.join(timeout=30)
    assert not runtime.fenced.is_set(), "no other instance declared this one dead"
    runtime.close()
    from sqlmodel import Session as DbSession

    from lockgate.machine.db.schema import Instance

    with DbSession(runtime.engine.store.engine) as s:
        row = s.get(Instance, instance_id)
    assert row is not None and row.status == "stopped"


def _executions(runtime: Runtime) -> list[Any]:
    from sqlmodel import select

    from lockgate.machine.db.schema import Execution

    with runtime.engine.store.session() as s:
        return list(s.exec(select(Execution)))


def test_an_expired_session_gets_404(make_runtime: Callable[..., Runtime]) -> None:
    clock = FakeClock()
    runtime = make_runtime(
        clock=clock, heartbeat_interval="3600", session_idle_timeout="60", session_cap="600"
    )
    key = key_for(runtime, "alice")

    async def scenario() -> None:
        async with serving(runtime) as (http, _):
            session_id = await raw_initialize(http, URL, key)
            listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            ok = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert ok.status_code == 200
            await eventually(
                lambda: (
                    (row := runtime.sessions.get(session_id)) is not None and row.status == "idle"
                ),
                "the session to go idle",
            )
            clock.advance(timedelta(seconds=120))
            assert runtime.sessions.sweep() == [session_id]
            expired = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert expired.status_code == 404, expired.text

    run(scenario())
