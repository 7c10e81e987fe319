"""The owed-request ledger's HTTP gate (`server/session_gate.py`), driven over ASGI on a real
runtime and database, in front of scripted stand-ins for the SDK's transport: what a client
receives (status, headers, bytes, -32010 reports, event ids) and what the ledger records
(sessions, owed ids answered, lost or reported) for each way a response can go.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from sqlmodel import select

from lockgate.machine.db.schema import OwedRequest, Session
from lockgate.machine.ledger import report_event_ids
from lockgate.machine.runtime import Runtime
from lockgate.server.auth import OVER_LIMIT
from lockgate.server.owed_response import DrainSignal, sse_event, stream_ready
from lockgate.server.session_gate import SESSION_NOT_FOUND, SessionGate
from tests.support.servers import run
from tests.support.sessions import PROTOCOL, REQUEST_LOST, opened, session_status
from tests.support.sse import sse_events, sse_messages

MakeRuntime = Callable[..., Runtime]
Message = dict[str, Any]
App = Callable[[Any, Any, Any], Awaitable[None]]

SSE = [(b"content-type", b"text/event-stream")]
JSON = [(b"content-type", b"application/json")]
PRIMING = b"id: 1:0\r\ndata: \r\n\r\n"
REQUEST_LOST_MARK = f'"code": {REQUEST_LOST}'


def call(request_id: Any = 1, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def answer(request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"ok": True}}


def data(message: Any) -> bytes:
    return f"event: message\r\ndata: {json.dumps(message)}\r\n\r\n".encode()


@dataclass
class Reply:
    messages: list[Message] = field(default_factory=list)

    @property
    def start(self) -> Message:
        [start] = [m for m in self.messages if m["type"] == "http.response.start"]
        return start

    @property
    def status(self) -> int:
        return int(self.start["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.start.get("headers", []))

    @property
    def bodies(self) -> list[Message]:
        return [m for m in self.messages if m["type"] == "http.response.body"]

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.bodies)

    def json(self) -> Any:
        return json.loads(self.body)

    def sse(self) -> list[Any]:
        return sse_messages(self.body)

    def reports(self) -> list[Any]:
        """The -32010 reports in an SSE body (other events may not even be JSON)."""
        events = sse_events(self.body.decode())
        return [json.loads(e.data) for e in events if REQUEST_LOST_MARK in e.data]

    @property
    def ended(self) -> bool:
        return bool(self.bodies) and not self.bodies[-1].get("more_body", False)


def scope(
    method: str = "POST",
    session_id: str | None = "s",
    principal: str = "alice",
    version: str | None = PROTOCOL,
    last_event_id: str | None = None,
) -> dict[str, Any]:
    headers: list[tuple[bytes, bytes]] = []
    if session_id is not None:
        headers.append((b"mcp-session-id", session_id.encode()))
    if version is not None:
        headers.append((b"mcp-protocol-version", version.encode()))
    if last_event_id is not None:
        headers.append((b"last-event-id", last_event_id.encode()))
    return {
        "type": "http",
        "method": method,
        "path": "/mcp",
        "headers": headers,
        "state": {"principal": principal},
    }


async def exchange(
    gate: SessionGate,
    request: dict[str, Any],
    body: Any = None,
    *,
    chunks: list[bytes] | None = None,
    then: list[Message] | None = None,
    observe: Callable[[Message], None] = lambda message: None,
    bare_end: bool = False,
) -> Reply:
    """One request through the gate: its body (JSON, or raw chunks), then the client's
    further messages (`then`), then a client that stays connected. The server side refuses
    a message after the response ended, as uvicorn does (`observe` sees each one first)."""
    if chunks is None:
        chunks = [json.dumps(body).encode()] if body is not None else [b""]
    incoming: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
        for n, chunk in enumerate(chunks)
    ]
    if bare_end:  # the last request message carries neither body nor more_body (both optional)
        incoming[-1] = {"type": "http.request"}
    incoming += list(then or [])
    reply = Reply()

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: MutableMapping[str, Any]) -> None:
        observe(dict(message))
        if reply.ended:
            raise RuntimeError(f"Unexpected ASGI message {message['type']!r} after the end")
        reply.messages.append(dict(message))

    with anyio.fail_after(30):
        await gate(request, receive, send)
    return reply


class Transport:
    """Stands for the SDK's transport: records what reached it, and answers with `script`."""

    def __init__(self, script: Callable[[Any, Any, Any], Awaitable[None]] | None = None):
        self.script = script
        self.scopes: list[Any] = []
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        if scope["type"] != "http":
            return
        if scope["method"] == "POST":
            first = await receive()
            assert first.get("more_body", False) is False
            self.bodies.append(first.get("body", b""))
        if self.script is not None:
            await self.script(scope, receive, send)
        else:
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})


def sse_script(*events: bytes, status: int = 200) -> App:
    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": SSE})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return script


def json_script(*parts: bytes, status: int = 200) -> App:
    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": JSON})
        for n, part in enumerate(parts):
            more = n < len(parts) - 1
            await send({"type": "http.response.body", "body": part, "more_body": more})

    return script


def gate_for(runtime: Runtime, app: App, **options: Any) -> SessionGate:
    settings: dict[str, Any] = {"deadline": 60, "drain": DrainSignal(), "held": lambda _: True}
    settings.update(options)
    return SessionGate(app, runtime.sessions, **settings)


def owed_rows(runtime: Runtime) -> list[OwedRequest]:
    with runtime.engine.store.session() as s:
        return list(s.exec(select(OwedRequest)))


def one_owed(runtime: Runtime) -> OwedRequest:
    [row] = owed_rows(runtime)
    return row


def lost_error_of(runtime: Runtime, row: OwedRequest) -> dict[str, Any]:
    fresh = runtime.ledger.get(row.id)
    assert fresh is not None
    return runtime.ledger.lost_error(fresh)


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


# -- a POST's owed id --------------------------------------------------------------------------


def test_an_answered_request_passes_through_untouched_and_is_consumed(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    during: list[str] = []
    events = (
        PRIMING,
        data({"jsonrpc": "2.0", "method": "notifications/progress"}),
        data(answer(7)),
    )
    inner = sse_script(*events)

    async def script(scope: Any, receive: Any, send: Any) -> None:
        during.append(session_status(runtime))
        [row] = owed_rows(runtime)
        during.append(row.status)
        await inner(scope, receive, send)

    transport = Transport(script)
    gate = gate_for(runtime, transport)
    request = call(7, name="resume", arguments={"executionId": "x" * 80})
    reply = run(exchange(gate, scope(), request))
    assert reply.status == 200 and reply.headers == dict(SSE)
    assert reply.body == b"".join(events)
    assert reply.ended
    assert transport.bodies == [json.dumps(request).encode()]
    assert during == ["active", "owed"]
    row = one_owed(runtime)
    assert (row.status, row.request_id, row.method) == ("answered", 7, "tools/call")
    assert row.execution_id == "x" * 64
    assert session_status(runtime) == "idle"


def test_only_a_result_or_error_for_the_owed_id_answers_it(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    not_answers = (
        data(answer(2)),  # another id
        data({"jsonrpc": "2.0", "id": 1, "method": "sampling/createMessage"}),  # a request
        b"event: message\r\ndata: {not json\r\n\r\n",
        data(["not", "a", "message"]),
        b"event: message\r\n\r\n",
    )
    gate = gate_for(runtime, Transport(sse_script(PRIMING, *not_answers)))
    reply = run(exchange(gate, scope(), call(1)))
    row = one_owed(runtime)
    assert row.status == "reported"
    lost = reply.reports()
    assert lost == [lost_error_of(runtime, row)]
    assert lost[0]["id"] == 1
    assert reply.ended


def test_an_answer_split_across_chunks_or_after_a_bad_event_answers_it(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    whole = data({"jsonrpc": "2.0", "id": "a", "error": {"code": 1, "message": "no"}})
    split = (PRIMING, whole[:20], whole[20:])
    bad_then_answer = (PRIMING + b"data: {oops\n\n" + data(answer("b")),)
    # Bytes that are not UTF-8 in an event, then the answer.
    not_utf8 = (PRIMING, b"event: message\r\ndata: \xff\xfe\r\n\r\n" + data(answer("c")))
    # The answer's JSON over two data lines, and with no space after the colon.
    lines = json.dumps(answer("d"), indent=1).split("\n")
    two_lines = (PRIMING, ("data: " + "\ndata: ".join(lines) + "\n\n").encode())
    no_space = (PRIMING, f"data:{json.dumps(answer('e'))}\n\n".encode())

    async def scenario() -> None:
        cases = (
            ("a", split),
            ("b", bad_then_answer),
            ("c", not_utf8),
            ("d", two_lines),
            ("e", no_space),
        )
        for request_id, events in cases:
            gate = gate_for(runtime, Transport(sse_script(*events)))
            reply = await exchange(gate, scope(), call(request_id))
            assert reply.body == b"".join(events)

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {
        name: "answered" for name in "abcde"
    }


def test_a_stream_ending_without_the_answer_reports_it_lost_on_that_stream(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    gate = gate_for(runtime, Transport(sse_script(PRIMING)))
    reply = run(exchange(gate, scope(), call(3)))
    row = one_owed(runtime)
    assert row.status == "reported"
    # The priming event, the report (an event without an id: the stream's own ids are the
    # SDK's), then the end of the stream the SDK wrote.
    report_event = f"event: message\r\ndata: {json.dumps(lost_error_of(runtime, row))}\r\n\r\n"
    assert [m["body"] for m in reply.bodies] == [PRIMING, report_event.encode(), b""]
    assert [m.get("more_body") for m in reply.bodies] == [True, True, False]
    [report] = reply.sse()
    assert report["error"]["code"] == REQUEST_LOST and report["id"] == 3
    assert report["error"]["data"]["next"] == "re-execute"
    assert session_status(runtime) == "idle"


def test_a_json_answer_is_recognised_whole_and_an_error_status_answers(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    whole = json.dumps(answer(1)).encode()

    async def bare_end(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        third = json.dumps(answer(3)).encode()
        await send({"type": "http.response.body", "body": third, "more_body": True})
        await send({"type": "http.response.body"})  # body and more_body are optional

    cases: list[tuple[int, App]] = [
        (1, json_script(whole[:10], whole[10:])),
        (2, json_script(b'{"error": "bad request"}', status=400)),
        (3, bare_end),
    ]

    async def scenario() -> None:
        for request_id, script in cases:
            gate = gate_for(runtime, Transport(script))
            reply = await exchange(gate, scope(), call(request_id))
            assert reply.headers == dict(JSON)

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {
        1: "answered",
        2: "answered",
        3: "answered",
    }


def test_an_error_status_stream_or_a_headerless_response_is_not_appended_to(
    make_runtime: MakeRuntime,
) -> None:
    """An SSE response with an error status, or one with no headers at all, gets no -32010
    written into it; its id is left lost for the session's next GET."""
    runtime = make_runtime()
    opened(runtime)

    async def headerless(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def scenario() -> None:
        for request_id, script in ((1, sse_script(PRIMING, status=400)), (2, headerless)):
            reply = await exchange(gate_for(runtime, Transport(script)), scope(), call(request_id))
            assert REQUEST_LOST_MARK.encode() not in reply.body

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {1: "lost", 2: "lost"}


def test_a_json_response_that_does_not_answer_leaves_the_id_lost_for_the_next_get(
    make_runtime: MakeRuntime,
) -> None:
    """A JSON response cannot take a second message: the id waits for the session's GET."""
    runtime = make_runtime()
    opened(runtime)
    wrong = json.dumps(answer(9)).encode()

    async def scenario() -> None:
        for request_id, body in ((1, wrong), (2, b"not json")):
            gate = gate_for(runtime, Transport(json_script(body)))
            reply = await exchange(gate, scope(), call(request_id))
            assert reply.body == body and reply.ended

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {1: "lost", 2: "lost"}


async def hang(scope: Any, receive: Any, send: Any) -> None:
    await anyio.sleep_forever()


def sse_then_hang(scope: Any, receive: Any, send: Any) -> Awaitable[None]:
    async def go() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        await anyio.sleep_forever()

    return go()


def test_a_passed_deadline_reports_the_id_on_its_stream_and_ends_it(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    gate = gate_for(runtime, Transport(sse_then_hang), deadline=0.2)
    reply = run(exchange(gate, scope(), call(4)))
    row = one_owed(runtime)
    assert row.status == "reported"
    assert [m["body"] for m in reply.bodies] == [
        PRIMING,
        sse_event(lost_error_of(runtime, row)),
        b"",
    ]
    assert [m.get("more_body") for m in reply.bodies] == [True, True, False]
    assert session_status(runtime) == "idle"


def test_a_request_not_started_by_the_deadline_is_answered_32010_as_json(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    gate = gate_for(runtime, Transport(hang), deadline=0.2)
    reply = run(exchange(gate, scope(), call(5)))
    row = one_owed(runtime)
    assert row.status == "reported"
    assert reply.status == 200 and reply.headers == dict(JSON)
    assert reply.json() == lost_error_of(runtime, row)
    assert reply.ended and len(reply.bodies) == 1


def test_a_json_response_under_way_at_the_deadline_is_left_lost(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)

    async def partial(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": "http.response.body", "body": b'{"jsonrpc"', "more_body": True})
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(partial), deadline=0.2)
    reply = run(exchange(gate, scope(), call(6)))
    assert reply.body == b'{"jsonrpc"'  # no second message in a JSON body
    assert one_owed(runtime).status == "lost"


def test_draining_reports_what_an_open_request_owes(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    drain = DrainSignal()

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        drain.trigger()
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(script), drain=drain)
    reply = run(exchange(gate, scope(), call(8)))
    assert one_owed(runtime).status == "reported"
    assert [m["id"] for m in reply.sse()] == [8]
    assert reply.ended


def test_a_client_gone_before_the_deadline_leaves_its_id_lost_for_the_next_get(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        assert (await receive())["type"] == "http.disconnect"
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(script), deadline=0.3)
    reply = run(exchange(gate, scope(), call(9), then=[{"type": "http.disconnect"}]))
    assert reply.body == PRIMING  # nothing written to a client that is gone
    assert one_owed(runtime).status == "lost"


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


def test_the_stream_is_ready_once_the_client_can_resume_it(make_runtime: MakeRuntime) -> None:
    """Tool handlers wait for `stream_ready`: on a protocol with a priming event, the
    priming event must be out first; on an older one (no priming event), the start."""
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
    assert seen == [(False, True), (False, True), (True, True)]
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
