"""A session's own requests at the session gate (`server/session_gate.py`), over ASGI on a
real runtime, in front of scripted stand-ins for the SDK's transport
(`tests/support/session_gate.py`): a successful initialize records the session before the
client learns it (one that opened none records none; one without parameters records empty
ones), a principal at its session limit is refused a new one; a DELETE closes the session
whoever holds its transport; a GET carries the lost reports under acknowledging event ids,
a resuming GET gets its stream's report, resuming from a report acknowledges it, a stream
with nothing left to say is an error, and a listening GET ends on a drain or with its
transport.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sqlmodel import select

from lockgate.machine.db.schema import Session
from lockgate.machine.ledger import report_event_ids
from lockgate.machine.runtime import Runtime
from lockgate.server.auth import OVER_LIMIT
from lockgate.server.owed_response import DrainSignal
from tests.support.servers import run
from tests.support.session_gate import (
    PRIMING,
    SSE,
    App,
    MakeRuntime,
    Message,
    Transport,
    answer,
    call,
    data,
    exchange,
    gate_for,
    one_owed,
    owed_rows,
    scope,
    sse_script,
)
from tests.support.sessions import PROTOCOL, close_always_loses, opened, session_status

# -- initialize ----------------------------------------------------------------------------


def initialize(protocol: str = PROTOCOL) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": protocol,
            "capabilities": {"roots": {}},
            "clientInfo": {"name": "c", "version": "2"},
        },
    }


def opening(session_id: str | None, status: int = 200, name: bytes = b"mcp-session-id") -> App:
    async def script(scope: Any, receive: Any, send: Any) -> None:
        headers = list(SSE)
        if session_id is not None:
            headers.append((name, session_id.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data(answer(0))})

    return script


def test_a_successful_initialize_records_the_session_before_the_client_learns_it(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    recorded: list[str] = []

    def observe(message: Message) -> None:
        if message["type"] == "http.response.start":
            recorded.append(session_status(runtime, "new"))

    gate = gate_for(runtime, Transport(opening("new", name=b"Mcp-Session-Id")))
    request = scope(session_id=None)
    reply = run(exchange(gate, request, initialize("2025-06-18"), observe=observe))
    assert reply.status == 200
    assert recorded == ["active"]
    row = runtime.sessions.get("new")
    assert row is not None
    assert (row.status, row.principal_id, row.protocol_version) == ("idle", "alice", "2025-06-18")
    assert (row.client_info, row.capabilities) == ({"name": "c", "version": "2"}, {"roots": {}})
    assert owed_rows(runtime) == []


def test_an_initialize_that_opened_no_session_records_none(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()

    async def scenario() -> None:
        async def bare(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200})  # no headers at all
            await send({"type": "http.response.body", "body": data(answer(0))})

        for script in (opening(None), opening("refused", status=400), bare):
            gate = gate_for(runtime, Transport(script))
            await exchange(gate, scope(session_id=None), initialize())
        # Not a request (no id): the transport's, never a session.
        notification = {k: v for k, v in initialize().items() if k != "id"}
        gate = gate_for(runtime, Transport(opening("notified")))
        await exchange(gate, scope(session_id=None), notification)
        # Another method without a session.
        gate = gate_for(runtime, Transport(opening("other")))
        await exchange(gate, scope(session_id=None), call(method="tools/list"))

    run(scenario())
    with runtime.engine.store.session() as s:
        assert list(s.exec(select(Session))) == []


def test_an_initialize_without_parameters_records_empty_ones(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    bare = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
    run(exchange(gate_for(runtime, Transport(opening("bare"))), scope(session_id=None), bare))
    row = runtime.sessions.get("bare")
    assert row is not None
    assert (row.protocol_version, row.client_info, row.capabilities) == ("", None, None)


def test_a_principal_at_its_session_limit_is_refused_a_new_one(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime, "a1")
    opened(runtime, "b1", principal="bob")

    async def scenario() -> None:
        limited = gate_for(runtime, Transport(opening("a2")), max_sessions_per_principal=2)
        assert (await exchange(limited, scope(session_id=None), initialize())).status == 200
        refused = gate_for(runtime, Transport(opening("a3")), max_sessions_per_principal=2)
        reply = await exchange(refused, scope(session_id=None), initialize())
        assert reply.status == 429
        assert reply.headers[b"retry-after"] == b"5"
        error = reply.json()["error"]
        assert error["code"] == OVER_LIMIT
        assert error["message"] == (
            "Too many open sessions: this API key's principal has 2 live sessions, the limit "
            "(LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL=2). Reuse an open session, or close unused "
            "ones (HTTP DELETE with their Mcp-Session-Id) and retry."
        )
        bobs = gate_for(runtime, Transport(opening("b2")), max_sessions_per_principal=2)
        request = scope(session_id=None, principal="bob")
        assert (await exchange(bobs, request, initialize())).status == 200
        unlimited = gate_for(runtime, Transport(opening("a4")))
        assert (await exchange(unlimited, scope(session_id=None), initialize())).status == 200

    run(scenario())
    assert runtime.sessions.live_count("alice") == 3
    assert runtime.sessions.get("a3") is None


# -- DELETE --------------------------------------------------------------------------------


def test_a_delete_closes_the_session_whoever_holds_its_transport(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime, "here")
    opened(runtime, "elsewhere")
    transport = Transport()

    async def scenario() -> None:
        held = gate_for(runtime, transport, held=lambda session_id: session_id == "here")
        reply = await exchange(held, scope("DELETE", session_id="here"))
        assert reply.status == 202  # the transport's own answer
        assert len(transport.scopes) == 1
        reply = await exchange(held, scope("DELETE", session_id="elsewhere"))
        assert reply.status == 200 and reply.body == b"" and reply.ended
        assert len(transport.scopes) == 1  # no transport to ask

    run(scenario())
    assert session_status(runtime, "here") == "closed"
    assert session_status(runtime, "elsewhere") == "closed"


def test_a_delete_that_cannot_win_its_write_is_503_and_the_session_stays_open(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every close attempt finds the session's own requests wrote first (staged: a request
    begins and ends after each of the close's reads): the DELETE is answered 503 with
    Retry-After and a message saying the session is still open, never a 200 that leaves it
    live; the next DELETE, once the session is quiet, closes it."""
    runtime = make_runtime()
    opened(runtime, "busy")
    transport = Transport()

    async def scenario() -> None:
        gate = gate_for(runtime, transport, held=lambda session_id: False)
        close_always_loses(runtime, monkeypatch, "busy")
        busy = await exchange(gate, scope("DELETE", session_id="busy"))
        monkeypatch.undo()
        assert busy.status == 503
        assert busy.headers[b"retry-after"] == b"1"
        error = busy.json()["error"]
        assert "still open" in error["message"] and "DELETE again" in error["message"]
        assert runtime.sessions.live("busy") is not None
        quiet = await exchange(gate, scope("DELETE", session_id="busy"))
        assert quiet.status == 200

    run(scenario())
    assert transport.scopes == []
    assert session_status(runtime, "busy") == "closed"


# -- GET: reports and resumption -------------------------------------------------------------


def lose(runtime: Runtime, request_id: Any, session_id: str = "s") -> str:
    owed = runtime.ledger.owe(session_id, request_id, "tools/call", None)
    runtime.ledger.lose(owed)
    return owed.id


def test_a_listening_get_carries_the_lost_reports_under_acknowledging_ids(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    first, second = lose(runtime, 1), lose(runtime, "two")
    transport = Transport()
    gate = gate_for(runtime, transport)
    reply = run(exchange(gate, scope("GET")))
    assert reply.status == 200
    assert reply.headers == {
        b"content-type": b"text/event-stream",
        b"cache-control": b"no-cache, no-transform",
    }
    assert [m["id"] for m in reply.sse()] == [1, "two"]
    ids = [line[4:] for line in reply.body.decode().split("\r\n") if line.startswith("id: ")]
    expected = report_event_ids("_GET_stream", [_rec(first), _rec(second)])
    assert ids == expected
    assert reply.ended and all(m.get("more_body") for m in reply.bodies[:-1])
    assert reply.bodies[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert transport.scopes == []  # the reports are the whole response
    assert {row.status for row in owed_rows(runtime)} == {"reported"}
    again = run(exchange(gate, scope("GET")))
    assert again.status == 202  # nothing left: the transport's listening stream
    assert gate._report_locks == {}


def _rec(owed_id: str) -> Any:
    from lockgate.machine.records import Record

    return Record("owed_request", owed_id, "lost", 1, {})


def test_a_resuming_get_gets_its_streams_report_under_that_streams_ids(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    mine, other = lose(runtime, 5), lose(runtime, 6)
    gate = gate_for(runtime, Transport())
    reply = run(exchange(gate, scope("GET", last_event_id="5:3")))
    assert [m["id"] for m in reply.sse()] == [5]
    assert f"id: 5:r{mine}\r\n".encode() in reply.body
    assert runtime.ledger.get(other) is not None
    assert {r.id: r.status for r in owed_rows(runtime)} == {mine: "reported", other: "lost"}


def test_resuming_from_a_report_acknowledges_it_and_goes_on_listening(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    first, second = lose(runtime, 1), lose(runtime, 2)
    transport = Transport()
    gate = gate_for(runtime, transport)
    [ack, _] = report_event_ids("_GET_stream", [_rec(first), _rec(second)])
    reply = run(exchange(gate, scope("GET", last_event_id=ack)))
    # The first was received: only the second is written, under an id naming it alone.
    assert [m["id"] for m in reply.sse()] == [2]
    assert f"id: _GET_stream:r{second}\r\n".encode() in reply.body
    # Resuming from the last report: a fresh listening stream, without the SDK-unknown id.
    [last] = report_event_ids("_GET_stream", [_rec(second)])
    reply = run(exchange(gate, scope("GET", last_event_id=last)))
    assert reply.status == 202
    [seen] = transport.scopes
    assert (b"last-event-id", last.encode()) not in seen["headers"]
    assert (b"mcp-session-id", b"s") in seen["headers"]
    assert {r.status for r in owed_rows(runtime)} == {"reported"}


def test_resuming_a_posts_stream_from_its_report_settles_it(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    mine = lose(runtime, 5)
    transport = Transport()
    gate = gate_for(runtime, transport, replayable=lambda session_id, event_id: True)
    [ack] = report_event_ids("5", [_rec(mine)])
    reply = run(exchange(gate, scope("GET", last_event_id=ack)))
    assert reply.status == 202  # replayed by the transport, from the same event id
    [seen] = transport.scopes
    assert (b"last-event-id", ack.encode()) in seen["headers"]
    assert one_owed(runtime).status == "reported"


def test_resuming_a_stream_with_nothing_left_to_say_is_an_error(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    runtime.ledger.owe("s", 7, "tools/call", None)  # still owed: its answer may come
    transport = Transport()
    asked: list[tuple[str, str]] = []

    def replayable(session_id: str, event_id: str) -> bool:
        asked.append((session_id, event_id))
        return event_id == "8:1"

    gate = gate_for(runtime, transport, replayable=replayable)

    async def scenario() -> None:
        gone = await exchange(gate, scope("GET", last_event_id="9:3"))
        assert gone.status == 404
        error = gone.json()["error"]
        assert error["code"] == -32600
        assert error["message"] == (
            "Nothing to resume on this stream: its request was already answered or reported."
        )
        for event_id in ("7:3", "8:1", "plain"):
            assert (await exchange(gate, scope("GET", last_event_id=event_id))).status == 202

    run(scenario())
    assert ("s", "9:3") in asked and ("s", "8:1") in asked
    assert len(transport.scopes) == 3


def test_a_listening_get_ends_when_the_server_drains(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    drain = DrainSignal()
    ended: list[bool] = []

    async def listening(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        drain.trigger()
        try:
            await anyio.sleep_forever()
        finally:
            ended.append(True)

    gate = gate_for(runtime, Transport(listening), drain=drain)
    reply = run(exchange(gate, scope("GET")))
    assert reply.status == 200 and ended == [True]


def test_a_listening_get_not_drained_ends_with_its_transport(make_runtime: MakeRuntime) -> None:
    """The transport reads the client's messages (its disconnect ends the stream)."""
    runtime = make_runtime()
    opened(runtime)
    inner = sse_script(PRIMING)

    async def listening(scope: Any, receive: Any, send: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        await inner(scope, receive, send)

    gate = gate_for(runtime, Transport(listening))
    reply = run(exchange(gate, scope("GET"), then=[{"type": "http.disconnect"}]))
    assert reply.body == PRIMING and reply.ended
