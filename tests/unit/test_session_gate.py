"""The owed-request ledger's HTTP gate (`server/session_gate.py`), driven over ASGI on a real
runtime and database, in front of scripted stand-ins for the SDK's transport
(`tests/support/session_gate.py`): what passes straight through (stateless requests, other
scopes and methods; unknown, another principal's or closed sessions get the same 404), and
how the gate reads a request and its response: the body in chunks or from a client gone,
parse errors, notifications and responses that owe nothing, `stream_ready` once the client
can resume, and other response messages.

A POST's owed id answered, reported or left lost is in `test_session_gate_owed_ids.py`;
initialize, DELETE and the session's GET (reports, resumption) in
`test_session_gate_sessions.py`.
"""

from __future__ import annotations

import json
from typing import Any

from lockgate.server.owed_response import stream_ready
from lockgate.server.session_gate import SESSION_NOT_FOUND
from tests.support.servers import run
from tests.support.session_gate import (
    JSON,
    PRIMING,
    SSE,
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
from tests.support.sessions import PROTOCOL, opened, session_status

# -- what passes straight through ------------------------------------------------------------


def test_stateless_requests_and_other_scopes_pass_straight_through(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    transport = Transport()
    gate = gate_for(runtime, transport)

    async def scenario() -> None:
        # A 2026 request has no session: even an unknown session id is not the gate's.
        stateless = scope(session_id="nobody", version="2026-07-28")
        reply = await exchange(gate, stateless, call())
        assert reply.status == 202
        lifespan = {"type": "lifespan"}
        await gate(lifespan, None, None)  # type: ignore[arg-type]
        assert transport.scopes == [stateless, lifespan]

    run(scenario())
    assert owed_rows(runtime) == []


def test_a_session_that_is_not_the_callers_live_one_is_not_found(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime, "mine")
    opened(runtime, "bobs", principal="bob")
    opened(runtime, "closed")
    runtime.sessions.close("closed")
    transport = Transport()
    gate = gate_for(runtime, transport)

    async def scenario() -> None:
        for session_id in ("nobody", "bobs", "closed"):
            for method in ("POST", "GET", "DELETE"):
                # No protocol version header is a 2025 request too.
                request = scope(method, session_id=session_id, version=None)
                reply = await exchange(gate, request, call())
                assert reply.status == 404, (session_id, method)
                assert reply.json() == {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": SESSION_NOT_FOUND},
                }
        assert transport.scopes == []
        ok = await exchange(gate, scope(session_id="mine"), call(method="notifications/x"))
        assert ok.status == 202

    run(scenario())
    assert session_status(runtime, "bobs") == "idle"  # a guess never closes it


def test_other_methods_and_sessionless_gets_are_the_transports(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    transport = Transport()
    gate = gate_for(runtime, transport)

    async def scenario() -> None:
        for request in (scope("PUT"), scope("GET", session_id=None), scope("DELETE", None)):
            reply = await exchange(gate, request)
            assert reply.status == 202
        assert len(transport.scopes) == 3

    run(scenario())
    assert session_status(runtime) == "idle"


# -- the request's body ------------------------------------------------------------------------


def test_a_client_gone_while_sending_its_body_reaches_the_transport_as_gone(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    seen: list[Message] = []

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class Gone(Transport):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            seen.append(await receive())
            await script(scope, receive, send)

    gate = gate_for(runtime, Gone())
    reply = run(exchange(gate, scope(), chunks=[], then=[{"type": "http.disconnect"}]))
    assert reply.status == 202
    assert seen == [{"type": "http.disconnect"}]
    assert owed_rows(runtime) == []


def test_a_body_in_chunks_reaches_the_transport_whole(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    transport = Transport(sse_script(PRIMING, data(answer(1))))
    gate = gate_for(runtime, transport)
    raw = json.dumps(call(1)).encode()
    run(exchange(gate, scope(), chunks=[raw[:5], raw[5:12], raw[12:]]))
    run(exchange(gate, scope(), chunks=[raw, b""], bare_end=True))
    assert transport.bodies == [raw, raw]
    assert [row.status for row in owed_rows(runtime)] == ["answered", "answered"]


def test_a_body_that_is_not_json_is_a_parse_error(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    transport = Transport()
    gate = gate_for(runtime, transport)

    async def scenario() -> None:
        for body in (b"{not json", b"\xff\xfe", b"[" * 100_000):
            reply = await exchange(gate, scope(), chunks=[body])
            assert reply.status == 400
            error = reply.json()["error"]
            assert error["code"] == -32700
            assert error["message"] == (
                "Parse error: the request body is not valid JSON (or nests deeper, or holds a "
                "longer number, than this server reads). Send one JSON-RPC message."
            )

    run(scenario())
    assert transport.scopes == []
    assert owed_rows(runtime) == []


def test_notifications_and_responses_owe_nothing(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    transport = Transport()
    gate = gate_for(runtime, transport)
    bodies = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "x", "id": None},
        answer(3),  # the client answering a server request
        [call(4)],
    ]

    async def scenario() -> None:
        for body in bodies:
            assert (await exchange(gate, scope(), body)).status == 202

    run(scenario())
    assert len(transport.scopes) == 4
    assert owed_rows(runtime) == []
    assert session_status(runtime) == "idle"


# -- the response ----------------------------------------------------------------------------


def test_the_stream_is_ready_once_the_client_can_resume_it(make_runtime: MakeRuntime) -> None:
    """Tool handlers wait for `stream_ready`: the priming event must be out first, on every
    protocol version (the transport primes them all)."""
    runtime = make_runtime()
    opened(runtime)
    seen: list[tuple[bool, bool]] = []

    async def script(scope: Any, receive: Any, send: Any) -> None:
        ready = stream_ready.get()
        assert ready is not None
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        after_start = ready.is_set()
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        seen.append((after_start, ready.is_set()))
        await send({"type": "http.response.body", "body": data(answer()), "more_body": False})

    async def scenario() -> None:
        for version in (PROTOCOL, None, "2025-06-18"):
            gate = gate_for(runtime, Transport(script))
            await exchange(gate, scope(version=version), call())

    run(scenario())
    assert seen == [(False, True), (False, True), (False, True)]
    assert stream_ready.get() is None


def test_a_json_response_is_ready_at_its_start(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    seen: list[bool] = []

    async def script(scope: Any, receive: Any, send: Any) -> None:
        ready = stream_ready.get()
        assert ready is not None
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        seen.append(ready.is_set())
        await send({"type": "http.response.body", "body": json.dumps(answer()).encode()})

    run(exchange(gate_for(runtime, Transport(script)), scope(), call()))
    assert seen == [True]


def test_other_response_messages_pass_through(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    other = {"type": "http.response.debug", "info": {}}
    inner = sse_script(PRIMING, data(answer()))

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send(other)
        await inner(scope, receive, send)
        await send({"type": "http.response.body", "body": b"late"})  # after the end

    reply = run(exchange(gate_for(runtime, Transport(script)), scope(), call()))
    assert reply.messages[0] == other
    assert b"late" not in reply.body
    assert one_owed(runtime).status == "answered"
