"""In front of the MCP transport: durable sessions and the owed-request ledger.

For a 2025-protocol session this layer
- records the session when its `initialize` succeeds, and refuses (403) a session id that
  belongs to another principal;
- records every request id a POST owes, consumes it when the response passes through, and,
  when the stream ends without it (or the response deadline passes, or the server drains),
  writes a JSON-RPC error -32010 for the id, saying what became of its execution;
- answers a GET on the session with the ids an earlier incarnation lost, then closes it.

Bytes are passed through untouched: on the happy path the client receives exactly what the
SDK wrote. Stateless 2026-07-28 requests have no session and pass straight through.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import anyio
from anyio import to_thread
from mcp.server.streamable_http import GET_STREAM_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import JsonValue

from lockgate.machine.records import Record
from lockgate.machine.sessions import Sessions, acknowledged_reports, report_event_ids
from lockgate.server.auth import (
    OVER_LIMIT,
    Message,
    Receive,
    Scope,
    Send,
    header,
    json_rpc_error,
    without_header,
)

log = logging.getLogger("lockgate.ledger")

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LIVE = ("active", "idle")
SESSION_NOT_FOUND = (
    "Session not found: it expired, was closed, or never existed for this API key. "
    "Start a new session (send initialize without Mcp-Session-Id)."
)
#: JSON-RPC parse error (the body is not JSON we can read).
PARSE_ERROR = -32700


def sse_event(message: dict[str, JsonValue], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\r\n" if event_id is not None else ""
    return f"{head}event: message\r\ndata: {json.dumps(message)}\r\n\r\n".encode()


def _messages_in(chunk: bytes, buffer: bytearray) -> list[Any]:
    """JSON-RPC messages in SSE events completed by `chunk` (partial events stay buffered)."""
    buffer.extend(chunk)
    text = buffer.decode("utf-8", errors="replace").replace("\r\n", "\n")
    *complete, rest = text.split("\n\n")
    buffer[:] = rest.encode()
    found = []
    for event in complete:
        data = "\n".join(
            line[5:].lstrip() for line in event.split("\n") if line.startswith("data:")
        )
        if data:
            try:
                found.append(json.loads(data))
            except json.JSONDecodeError:
                continue
    return found


def _answers(message: Any, request_id: JsonValue) -> bool:
    return (
        isinstance(message, dict)
        and message.get("id") == request_id
        and ("result" in message or "error" in message)
    )


class DrainSignal:
    """Set once the process starts draining (SIGTERM); waited on by open requests."""

    def __init__(self) -> None:
        self.flag = threading.Event()

    def trigger(self) -> None:
        self.flag.set()

    async def wait(self) -> None:
        # The flag is set from a signal handler's thread; a short poll keeps this free of
        # loop plumbing and costs nothing measurable next to a request's lifetime.
        while not self.flag.is_set():
            await anyio.sleep(0.1)


#: Set once the owed response carries what a client needs to resume it (the priming event
#: with its id, or the response start when none is coming); tool handlers wait for it, so a
#: crash early in a request still leaves the client a stream to resume and collect from.
stream_ready: ContextVar[anyio.Event | None] = ContextVar("lockgate_stream_ready", default=None)


class OwedResponse:
    """Watches one POST's response for the answer it owes; reports it lost otherwise."""

    def __init__(self, sessions: Sessions, owed: Record, request_id: JsonValue, send: Send) -> None:
        self.sessions, self.owed, self.request_id, self._send = sessions, owed, request_id, send
        self.started = False
        self.finished = False
        self.sse = False
        self.settled = False
        self.client_gone = False
        self.status = 0
        self._buffer = bytearray()
        self._json = bytearray()
        self._lock = anyio.Lock()
        self.ready = anyio.Event()
        #: Whether the SDK sends a priming event first (protocol 2025-11-25 and later).
        self.primes = True

    async def send(self, message: Message) -> None:
        async with self._lock:
            if self.finished:
                return  # we already ended this response (deadline or drain)
            if message["type"] == "http.response.start":
                self.started = True
                self.status = int(message["status"])
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                self.sse = content_type.startswith(b"text/event-stream")
                await self._send(message)
                if not (self.sse and self.primes):
                    self.ready.set()
                return
            if message["type"] != "http.response.body":
                await self._send(message)
                return
            body: bytes = message.get("body", b"")
            more = bool(message.get("more_body", False))
            if not more and not self.settled and self.sse and self.status < 400:
                # The stream is ending without our answer: report the id lost first.
                await self._report_locked(final=False)
            await self._send(message)
            self.ready.set()
            if not more:
                self.finished = True
            if self.settled:
                return
            answered = False
            if self.sse:
                answered = any(
                    _answers(m, self.request_id) for m in _messages_in(body, self._buffer)
                )
            else:
                self._json.extend(body)
                if not more:
                    answered = self.status >= 400 or _answers(self._parse_json(), self.request_id)
            if answered:
                self.settled = True
                await to_thread.run_sync(self.sessions.answered, self.owed)

    def _parse_json(self) -> Any:
        try:
            return json.loads(self._json)
        except json.JSONDecodeError:
            return None

    async def _report_locked(self, *, final: bool) -> None:
        """Write -32010 for the owed id (then mark it reported), ending the response when
        `final`. If the client is gone, it stays lost, for the session's next GET."""
        await to_thread.run_sync(self.sessions.lose, self.owed)
        self.settled = True
        if self.client_gone:
            return
        error = await to_thread.run_sync(self._lost_error)
        if not self.started:
            body = json.dumps(error).encode()
            await self._send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await self._send({"type": "http.response.body", "body": body, "more_body": False})
            self.finished = True
        else:
            # More follows either way: the end of the stream, ours or the SDK's. (A report
            # that ended the response itself made the empty end a second, refused message.)
            await self._send(
                {"type": "http.response.body", "body": sse_event(error), "more_body": True}
            )
            if final:
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
                self.finished = True
        await to_thread.run_sync(self.sessions.reported, self.owed)

    def _lost_error(self) -> dict[str, JsonValue]:
        row = self.sessions.get_owed(self.owed.id)
        assert row is not None
        return self.sessions.lost_error(row)

    async def give_up(self) -> None:
        """The deadline passed or the server drains: answer -32010 and end the response."""
        async with self._lock:
            if self.settled:
                return
            if self.finished or (self.started and not self.sse):
                # The response ended without the answer (a JSON one, or an error status), or
                # a JSON response is under way and cannot take a second message: the id is
                # lost, for the session's next GET.
                await to_thread.run_sync(self.sessions.lose, self.owed)
                self.settled = True
                return
            await self._report_locked(final=True)


class SessionGate:
    def __init__(
        self,
        app: ASGIApp,
        sessions: Sessions,
        *,
        deadline: float,
        drain: DrainSignal,
        held: Callable[[str], bool],
        replayable: Callable[[str, str], bool] = lambda session_id, event_id: False,
        max_sessions_per_principal: int | None = None,
    ) -> None:
        self.app, self.sessions, self.deadline, self.drain = app, sessions, deadline, drain
        self._report_locks: dict[str, anyio.Lock] = {}
        #: Whether the transport holds a session in memory (else a DELETE is ours to answer).
        self.held = held
        #: Whether this process can replay the events after an event id on a session (its
        #: own streams of that session: every session has its own replay log).
        self.replayable = replayable
        self.max_sessions_per_principal = max_sessions_per_principal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = header(scope, b"mcp-protocol-version")
        stateless = version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        if scope["type"] != "http" or stateless:
            await self.app(scope, receive, send)
            return
        principal = scope.get("state", {}).get("principal")
        session_id = header(scope, b"mcp-session-id")
        row = None
        if session_id is not None:
            row = await to_thread.run_sync(self.sessions.get, session_id)
            if row is None or row.principal_id != principal or row.status not in LIVE:
                # Unknown, another principal's, expired or closed: the same answer for all,
                # so the answer never tells whether someone else's session exists. (Gone
                # even if this process still holds its transport.)
                await json_rpc_error(send, 404, -32600, SESSION_NOT_FOUND)
                return
        live = row is not None
        method = scope["method"]
        if method == "GET" and session_id is not None and live:
            # A GET resuming one POST's stream (Last-Event-ID "<stream>:<n>"; a POST's stream
            # is its request id) gets that request's report only: the client reads whatever
            # arrives there as that request's answer. The listening GET gets all of them.
            resumed = header(scope, b"last-event-id")
            acknowledged = acknowledged_reports(resumed)
            if acknowledged is not None:
                # The client resumes from a report we wrote: it has every report named in
                # that event id, so they are settled now and never written to it again.
                await to_thread.run_sync(self.sessions.acknowledge, session_id, acknowledged[1])
                if acknowledged[0] == GET_STREAM_KEY:
                    # Its listening GET: the SDK never minted this id, so it must not try to
                    # replay from it; the GET goes on as a fresh listening stream.
                    resumed = None
                    scope = without_header(scope, b"last-event-id")
            stream = resumed.rpartition(":")[0] or None if resumed else None
            if await self._report_lost(session_id, send, stream):
                return
            if (
                resumed is not None
                and stream is not None
                and not self.replayable(session_id, resumed)
                and not await to_thread.run_sync(self.sessions.still_owed, session_id, stream)
            ):
                # An earlier incarnation's stream with nothing left to say: an empty stream
                # would have the client reconnect forever; an error makes it give up.
                await json_rpc_error(
                    send,
                    404,
                    -32600,
                    "Nothing to resume on this stream: its request was already answered or "
                    "reported.",
                )
                return
            await self._until_drained(self.app, scope, receive, send)
        elif method == "DELETE" and session_id is not None and live:
            await to_thread.run_sync(self.sessions.close, session_id)
            if self.held(session_id):
                await self.app(scope, receive, send)
            else:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b""})
        elif method == "POST":
            await self._post(scope, receive, send, session_id if live else None, principal)
        else:
            await self.app(scope, receive, send)

    async def _until_drained(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        async with anyio.create_task_group() as group:

            async def end_on_drain() -> None:
                await self.drain.wait()
                group.cancel_scope.cancel()

            group.start_soon(end_on_drain)
            await app(scope, receive, send)
            group.cancel_scope.cancel()

    async def _report_lost(self, session_id: str, send: Send, stream: str | None) -> bool:
        # The client's listening GET and its resuming GET often arrive together after a
        # restart: one of them reports, the other then finds nothing left to report.
        lock = self._report_locks.setdefault(session_id, anyio.Lock())
        try:
            async with lock:
                reports = await to_thread.run_sync(self.sessions.lost_reports, session_id, stream)
                if not reports:
                    return False
                await self._write_reports(reports, send, stream)
                return True
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._report_locks.pop(session_id, None)

    async def _write_reports(
        self, reports: list[tuple[Record, dict[str, JsonValue]]], send: Send, stream: str | None
    ) -> None:
        """Each report is an event whose id names it and those before it, so the
        `Last-Event-ID` of the client's next GET acknowledges what it received (a crash
        between writing a report and recording it never writes it twice)."""
        ids = report_event_ids(stream or GET_STREAM_KEY, [record for record, _ in reports])
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache, no-transform"),
                ],
            }
        )
        for (record, error), event_id in zip(reports, ids, strict=True):
            body = sse_event(error, event_id)
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await to_thread.run_sync(self.sessions.reported, record)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, session_id: str | None, principal: Any
    ) -> None:
        chunks: list[bytes] = []
        disconnected = False
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            parsed = json.loads(body) if body else None
        except (ValueError, RecursionError):
            # Not JSON, not UTF-8, an integer too long to convert, nesting too deep: the
            # client's mistake, answered as one (never a server error).
            await json_rpc_error(
                send,
                400,
                PARSE_ERROR,
                "Parse error: the request body is not valid JSON (or nests deeper, or holds "
                "a longer number, than this server reads). Send one JSON-RPC message.",
            )
            return
        replayed = False
        gone = anyio.Event()

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if disconnected:
                    return {"type": "http.disconnect"}
                return {"type": "http.request", "body": body, "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        is_request = (
            isinstance(parsed, dict) and "method" in parsed and parsed.get("id") is not None
        )
        if session_id is None:
            if is_request and isinstance(parsed, dict) and parsed.get("method") == "initialize":
                if await self._at_session_limit(principal, send):
                    return
                await self._initialize(scope, replay, send, parsed, principal)
            else:
                await self.app(scope, replay, send)
            return
        await to_thread.run_sync(self.sessions.begin_request, session_id)
        try:
            if not is_request or not isinstance(parsed, dict):
                await self.app(scope, replay, send)
                return
            request_id: JsonValue = parsed["id"]
            execution_id = _execution_argument(parsed)
            owed = await to_thread.run_sync(
                self.sessions.owe, session_id, request_id, str(parsed["method"]), execution_id
            )
            watcher = OwedResponse(self.sessions, owed, request_id, send)
            version = header(scope, b"mcp-protocol-version") or "2025-11-25"
            watcher.primes = version >= "2025-11-25"
            token = stream_ready.set(watcher.ready)
            async with anyio.create_task_group() as group:

                async def stop_when_due() -> None:
                    with anyio.move_on_after(self.deadline):
                        await self.drain.wait()
                    group.cancel_scope.cancel()

                async def note_gone() -> None:
                    await gone.wait()
                    watcher.client_gone = True

                group.start_soon(stop_when_due)
                group.start_soon(note_gone)
                try:
                    await self.app(scope, replay, watcher.send)
                finally:
                    stream_ready.reset(token)
                group.cancel_scope.cancel()
            if not watcher.settled:
                with anyio.CancelScope(shield=True):
                    await watcher.give_up()
        finally:
            with anyio.CancelScope(shield=True):
                await to_thread.run_sync(self.sessions.end_request, session_id)

    async def _at_session_limit(self, principal: Any, send: Send) -> bool:
        """Refuse a new session when the principal already has its limit of live ones."""
        limit = self.max_sessions_per_principal
        if limit is None:
            return False
        count = await to_thread.run_sync(self.sessions.live_count, str(principal))
        if count < limit:
            return False
        await json_rpc_error(
            send,
            429,
            OVER_LIMIT,
            f"Too many open sessions: this API key's principal has {count} live sessions, "
            f"the limit (LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL={limit}). Reuse an open session, "
            "or close unused ones (HTTP DELETE with their Mcp-Session-Id) and retry.",
            ((b"retry-after", b"5"),),
        )
        return True

    async def _initialize(
        self, scope: Scope, receive: Receive, send: Send, request: dict[str, Any], principal: Any
    ) -> None:
        """Let the SDK answer `initialize`, then record the session it opened."""
        opened: dict[str, str] = {}
        params = request.get("params") or {}

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start" and int(message["status"]) < 400:
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        opened["id"] = value.decode("latin-1")
                if "id" in opened:
                    # Durable before the client learns the id: its next request may land on
                    # another instance, or after a restart.
                    await to_thread.run_sync(
                        self.sessions.open,
                        opened["id"],
                        str(principal),
                        str(params.get("protocolVersion", "")),
                        params.get("clientInfo"),
                        params.get("capabilities"),
                    )
            await send(message)

        await self.app(scope, receive, capture)
        if "id" in opened:
            # The initialize exchange is over; the session waits for its next request.
            await to_thread.run_sync(self.sessions.end_request, opened["id"])


def _execution_argument(request: dict[str, Any]) -> str | None:
    """The executionId a `resume` call names, so its loss can be reported against it."""
    params = request.get("params")
    if isinstance(params, dict):
        arguments = params.get("arguments")
        if isinstance(arguments, dict) and isinstance(arguments.get("executionId"), str):
            return str(arguments["executionId"])[:64]
    return None
