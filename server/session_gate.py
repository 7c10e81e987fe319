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
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio import to_thread
from mcp.server.streamable_http import GET_STREAM_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import JsonValue

from lockgate.machine.db.schema import Session
from lockgate.machine.ledger import OwedRecord, acknowledged_reports, report_event_ids
from lockgate.machine.sessions import SessionBusy, SessionLimitReached, Sessions
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
from lockgate.server.owed_response import DrainSignal, OwedResponse, sse_event, stream_ready
from lockgate.server.session_notices import Notices, SessionNotices

log = logging.getLogger("lockgate.ledger")

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_NOT_FOUND = (
    "Session not found: it expired, was closed, or never existed for this API key. "
    "Start a new session (send initialize without Mcp-Session-Id)."
)
#: JSON-RPC parse error (the body is not JSON we can read).
PARSE_ERROR = -32700


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
        notices: SessionNotices | None = None,
    ) -> None:
        self.app, self.sessions, self.deadline, self.drain = app, sessions, deadline, drain
        self.ledger = sessions.ledger
        self._report_locks: dict[str, anyio.Lock] = {}
        #: Whether the transport holds a session in memory (else a DELETE is ours to answer).
        self.held = held
        #: Whether this process can replay the events after an event id on a session (its
        #: own streams of that session: every session has its own replay log).
        self.replayable = replayable
        self.max_sessions_per_principal = max_sessions_per_principal
        #: What each request of a session is told first (lost requests, expiring approvals).
        self.notices = notices

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
            # `live` also expires a session past its idle timeout, at this use.
            row = await to_thread.run_sync(self.sessions.live, session_id)
            if row is None or row.principal_id != principal:
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
                await to_thread.run_sync(self.ledger.acknowledge, session_id, acknowledged[1])
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
                and not await to_thread.run_sync(self.ledger.still_owed, session_id, stream)
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
            try:
                await to_thread.run_sync(self.sessions.close, session_id)
            except SessionBusy:
                await json_rpc_error(
                    send,
                    503,
                    -32603,
                    "The session is too busy to close right now (its requests keep writing "
                    "to it); it is still open. Send the DELETE again in a moment.",
                    ((b"retry-after", b"1"),),
                )
                return
            if self.held(session_id):
                await self.app(scope, receive, send)
            else:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b""})
        elif method == "POST":
            await self._post(scope, receive, send, row, principal)
        else:
            await self.app(scope, receive, send)

    async def _until_drained(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        with anyio.CancelScope() as listening, self.drain.cancels(listening):
            await app(scope, receive, send)

    async def _report_lost(self, session_id: str, send: Send, stream: str | None) -> bool:
        # The client's listening GET and its resuming GET often arrive together after a
        # restart: one of them reports, the other then finds nothing left to report.
        lock = self._report_locks.setdefault(session_id, anyio.Lock())
        try:
            async with lock:
                reports = await to_thread.run_sync(self.ledger.lost_reports, session_id, stream)
                if not reports:
                    return False
                await self._write_reports(reports, send, stream)
                return True
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._report_locks.pop(session_id, None)

    async def _write_reports(
        self, reports: list[tuple[OwedRecord, dict[str, JsonValue]]], send: Send, stream: str | None
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
            await to_thread.run_sync(self.ledger.reported, record)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, row: Session | None, principal: Any
    ) -> None:
        """A POST, on the live session `row` as this request's check read it (None: no
        session yet, an initialize)."""
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
        watcher: OwedResponse | None = None

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if disconnected:
                    return {"type": "http.disconnect"}
                return {"type": "http.request", "body": body, "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect" and watcher is not None:
                watcher.client_gone = True
            return message

        is_request = (
            isinstance(parsed, dict) and "method" in parsed and parsed.get("id") is not None
        )
        if row is None:
            if is_request and isinstance(parsed, dict) and parsed.get("method") == "initialize":
                if await self._at_session_limit(principal, send):
                    return
                await self._initialize(scope, replay, send, parsed, principal)
            else:
                await self.app(scope, replay, send)
            return
        session_id = row.id
        request = parsed if is_request and isinstance(parsed, dict) else None
        began = ended = False

        def end() -> None:
            """The end of the request's activity on the session, once (in a worker thread:
            right after its answer is out, or when the request is over)."""
            nonlocal ended
            if began and not ended:
                ended = True
                self.sessions.end_request(session_id)

        def arrive() -> tuple[OwedRecord, Notices | None] | None:
            """The session's activity, the request's entry in the ledger, and what the
            session is to be told: in one trip to a worker thread (each trip costs the event
            loop more than any of them)."""
            nonlocal began
            self.sessions.begin_request(session_id, row)
            began = True
            if request is None:
                return None
            owed = self.ledger.owe(
                session_id, request["id"], str(request["method"]), _execution_argument(request)
            )
            return owed, None if self.notices is None else self.notices.for_request(row)

        try:
            arrived = await to_thread.run_sync(arrive)
            if request is None or arrived is None:
                await self.app(scope, replay, send)
                return
            owed, notices = arrived
            request_id: JsonValue = request["id"]
            watcher = OwedResponse(self.ledger, owed, request_id, send, notices, end)
            try:
                await self._answer(scope, replay, watcher)
            except anyio.get_cancelled_exc_class():
                # The server cancelled this request (a shutdown past its grace period):
                # nothing written now is sure to reach the client, so an id not settled yet
                # is lost, for the session's next GET, never left owed by a live incarnation.
                with anyio.CancelScope(shield=True):
                    await watcher.cancelled()
                raise
            if not watcher.settled:
                with anyio.CancelScope(shield=True):
                    await watcher.give_up()
        finally:
            if began and not ended:
                with anyio.CancelScope(shield=True):
                    await to_thread.run_sync(end)

    async def _answer(self, scope: Scope, replay: Receive, watcher: OwedResponse) -> None:
        """The transport answers the request through `watcher`, until it is done, the
        response deadline passes or the server drains."""
        token = stream_ready.set(watcher.ready)
        # A cancel scope, not a task group with a task waiting for the deadline or the drain:
        # the group and its tasks cost about 150 us of the event loop a request, a scope 10.
        try:
            with (
                anyio.CancelScope(deadline=anyio.current_time() + self.deadline) as due,
                self.drain.cancels(due),
            ):
                await self.app(scope, replay, watcher.send)
        finally:
            stream_ready.reset(token)

    async def _at_session_limit(self, principal: Any, send: Send) -> bool:
        """Refuse a new session when the principal already has its limit of live ones."""
        limit = self.max_sessions_per_principal
        if limit is None:
            return False
        count = await to_thread.run_sync(self.sessions.live_count, str(principal))
        if count < limit:
            return False
        await self._refuse_session(send, count, limit)
        return True

    @staticmethod
    async def _refuse_session(send: Send, count: int, limit: int) -> None:
        await json_rpc_error(
            send,
            429,
            OVER_LIMIT,
            f"Too many open sessions: this API key's principal has {count} live sessions, "
            f"the limit (LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL={limit}). Reuse an open session, "
            "or close unused ones (HTTP DELETE with their Mcp-Session-Id) and retry.",
            ((b"retry-after", b"5"),),
        )

    async def _initialize(
        self, scope: Scope, receive: Receive, send: Send, request: dict[str, Any], principal: Any
    ) -> None:
        """Let the SDK answer `initialize`, then record the session it opened."""
        opened: dict[str, str] = {}
        refused: list[SessionLimitReached] = []
        params = request.get("params") or {}
        limit = self.max_sessions_per_principal

        async def capture(message: Message) -> None:
            if refused:
                return  # the SDK's answer is replaced by the refusal
            if message["type"] == "http.response.start" and int(message["status"]) < 400:
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        opened["id"] = value.decode("latin-1")
                if "id" in opened:
                    # Durable before the client learns the id: its next request may land on
                    # another instance, or after a restart. The principal's live sessions
                    # are counted in the same transaction, so racing initializes cannot
                    # overshoot the limit; the loser's id is never sent, and the SDK's
                    # transport for it ends at its idle timeout.
                    try:
                        await to_thread.run_sync(
                            lambda: self.sessions.open(
                                opened["id"],
                                str(principal),
                                str(params.get("protocolVersion", "")),
                                params.get("clientInfo"),
                                params.get("capabilities"),
                                limit=limit,
                            )
                        )
                    except SessionLimitReached as over:
                        refused.append(over)
                        assert limit is not None
                        await self._refuse_session(send, over.live, limit)
                        return
            await send(message)

        await self.app(scope, receive, capture)
        if "id" in opened and not refused:
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
