"""The harness of the session gate's tests (`tests/test_session_gate*.py`): the gate
(`server/session_gate.py`) driven over ASGI on a real runtime, in front of scripted
stand-ins for the SDK's transport.

- Messages a client sends (`call`, `answer`, SSE `data`) and the ASGI scope of its request
  (`scope`); `exchange` sends one request through the gate and collects the `Reply`.
- `Transport`, the stand-in for the SDK's transport, and scripts for it (`sse_script`,
  `json_script`); `gate_for` puts a gate in front of one.
- The test's reads of the ledger (`owed_rows`, `one_owed`, `lost_error_of`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from sqlmodel import select

from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.runtime import Runtime
from lockgate.server.owed_response import DrainSignal
from lockgate.server.session_gate import SessionGate
from tests.support.sessions import PROTOCOL, REQUEST_LOST
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
