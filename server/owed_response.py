"""One POST's response on its way to the client, watched for the answer it owes.

`OwedResponse` passes the SDK's response through byte for byte, reading it as it goes (SSE
events or one JSON body) for the result or error that answers the owed request id; when the
response ends without it (or the deadline passes, or the server drains, or the client left)
it writes the -32010 report for the id, or leaves it lost for the session's next GET. Also
here: the SSE event bytes the gate writes, and the drain signal a response ends on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import anyio
from anyio import from_thread, to_thread
from pydantic import JsonValue

from lockgate.machine.ledger import Ledger, OwedRecord
from lockgate.server.auth import Message, Send


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
    """Set once the process starts draining (SIGTERM): the cancel scopes of open requests
    and streams are cancelled (`cancels`)."""

    def __init__(self) -> None:
        self.flag = threading.Event()
        #: The scopes to cancel, touched on the event loop's thread only.
        self._scopes: set[anyio.CancelScope] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def trigger(self) -> None:
        """From any thread, or a signal handler: the scopes are cancelled on the loop."""
        self.flag.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._cancel_all)

    def _cancel_all(self) -> None:
        for scope in list(self._scopes):
            scope.cancel()

    @contextlib.contextmanager
    def cancels(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Cancel `scope` when the drain starts (at once if it has), while in the block."""
        # Set before the flag is read: a trigger in between finds the loop and cancels
        # the scope added below, on this thread, after this block has begun.
        self._loop = asyncio.get_running_loop()
        self._scopes.add(scope)
        if self.flag.is_set():
            scope.cancel()
        try:
            yield
        finally:
            self._scopes.discard(scope)


#: Set once the owed response carries what a client needs to resume it (the priming event
#: with its id, or the response start when none is coming); tool handlers wait for it, so a
#: crash early in a request still leaves the client a stream to resume and collect from.
stream_ready: ContextVar[anyio.Event | None] = ContextVar("lockgate_stream_ready", default=None)


class OwedResponse:
    """Watches one POST's response for the answer it owes; reports it lost otherwise."""

    def __init__(
        self,
        ledger: Ledger,
        owed: OwedRecord,
        request_id: JsonValue,
        send: Send,
        notices: Callable[[], list[dict[str, JsonValue]]] | None = None,
        after_answer: Callable[[], None] | None = None,
    ) -> None:
        self.ledger, self.owed, self.request_id, self._send = ledger, owed, request_id, send
        #: Run once the answer is out and its entry consumed, in the same worker thread (the
        #: end of the session's activity: a trip of its own cost more than the write).
        self._after_answer = after_answer
        #: What the session is told first (`server.session_notices`: read as the request
        #: arrived, told without a read), right after the stream's priming event; taken once.
        self._notices = notices
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
                # An SSE stream is ready once its priming event is out (every session's
                # streams are primed: `server/durable_sessions.PrimingTransport`).
                if not self.sse:
                    self.ready.set()
                return
            if message["type"] != "http.response.body":
                await self._send(message)
                return
            body: bytes = message.get("body", b"")
            more = bool(message.get("more_body", False))
            answers = not self.settled and self._carries_answer(body, more)
            if not more and not self.settled and not answers and self.sse and self.status < 400:
                # The stream is ending without our answer: report the id lost first.
                await self._report_locked(final=False)
            if answers:
                # The bytes are written as the ledger's `answer` transition's effect, so the
                # entry is consumed only once they are out: a crash between the two leaves it
                # owed, reported -32010 later, never answered-but-unsent.
                self.settled = True
                written = False

                async def deliver() -> None:
                    await self._send(message)

                def write() -> None:
                    nonlocal written
                    from_thread.run(deliver)
                    written = True

                def answer() -> None:
                    self.ledger.answered(self.owed, write)
                    if self._after_answer is not None:
                        self._after_answer()

                await to_thread.run_sync(answer)
                if not written:  # the entry had moved on before the write: still deliver it
                    await self._send(message)
            else:
                await self._send(message)
            self.ready.set()
            if not more:
                self.finished = True
            elif self._notices is not None and self.sse and self.status < 400:
                await self._tell_locked()

    def _carries_answer(self, body: bytes, more: bool) -> bool:
        """Whether this part of the response completes the answer to the owed id."""
        if self.sse:
            return any(_answers(m, self.request_id) for m in _messages_in(body, self._buffer))
        self._json.extend(body)
        if more:
            return False
        return self.status >= 400 or _answers(self._parse_json(), self.request_id)

    async def _tell_locked(self) -> None:
        notices, self._notices = self._notices, None
        assert notices is not None
        for notice in notices():
            await self._send(
                {"type": "http.response.body", "body": sse_event(notice), "more_body": True}
            )

    def _parse_json(self) -> Any:
        try:
            return json.loads(self._json)
        except json.JSONDecodeError:
            return None

    async def _report_locked(self, *, final: bool) -> None:
        """Write -32010 for the owed id (then mark it reported), ending the response when
        `final`. If the client is gone, it stays lost, for the session's next GET."""
        await to_thread.run_sync(self.ledger.lose, self.owed)
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
        await to_thread.run_sync(self.ledger.reported, self.owed)

    def _lost_error(self) -> dict[str, JsonValue]:
        row = self.ledger.get(self.owed.id)
        assert row is not None
        return self.ledger.lost_error(row)

    async def cancelled(self) -> None:
        """The server cancelled the request: an id not settled yet is lost (what is written
        now may never reach the client; the session's next GET reports it)."""
        async with self._lock:
            if not self.settled:
                await to_thread.run_sync(self.ledger.lose, self.owed)
                self.settled = True

    async def give_up(self) -> None:
        """The deadline passed or the server drains: answer -32010 and end the response."""
        async with self._lock:
            if self.settled:
                return
            if self.finished or (self.started and not self.sse):
                # The response ended without the answer (a JSON one, or an error status), or
                # a JSON response is under way and cannot take a second message: the id is
                # lost, for the session's next GET.
                await to_thread.run_sync(self.ledger.lose, self.owed)
                self.settled = True
                return
            await self._report_locked(final=True)
