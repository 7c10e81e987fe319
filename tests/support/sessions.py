"""Helpers for the durable-session and owed-request-ledger tests.

- `Relay`: a loopback TCP relay in its own thread. The MCP client has one URL for its whole
  life; the relay forwards each connection to whichever server process is current, and
  holds new connections while none is (between a SIGKILL and the restart's readiness), so
  the client's reconnecting GET reaches the restarted server instead of exhausting its two
  reconnection attempts against a closed port. Bytes are forwarded untouched, and kept
  (capped) so a test can see what a server wrote before it died.
- Raw HTTP for the 2025 session protocol (initialize, a request with a session id, SSE
  parsing), for checks the SDK client hides (status codes, bodies, stream ends).
- Restart choreography: wait for a process to die (polling, with a deadline), hold the
  relay, start the next process, point the relay at it.
- In process: the real application (`create_app`) on a test runtime through ASGI, with its
  lifespan entered, and a fake clock.
- The test's own reads of the shared database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError
from sqlalchemy import Engine as SqlEngine
from sqlmodel import Session as DbSession
from sqlmodel import select
from starlette.routing import Route

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Execution, Instance, OwedRequest, Session
from lockgate.machine.runtime import Runtime
from lockgate.server.app import WhenReady, create_app
from lockgate.server.auth import BearerAuth
from lockgate.server.keys import ApiKeys
from lockgate.server.session_gate import SessionGate
from tests.support.servers import Deployment, LockgateServer
from tests.support.sse import sse_messages

#: The 2025 protocol version the raw requests speak (the SDK client negotiates the same).
PROTOCOL = "2025-11-25"
#: JSON-RPC code of "the server lost this request".
REQUEST_LOST = -32010
#: How long a relayed connection waits for a server to forward to.
HOLD_TIMEOUT = 60.0


@dataclass
class Capture:
    """One relayed connection: what the client sent, what the server wrote back (each
    capped at 1 MiB), and whether the server side ended it (a crash) rather than the
    client."""

    sent: bytearray = field(default_factory=bytearray)
    received: bytearray = field(default_factory=bytearray)
    ended_by_server: bool = False


class Relay:
    """127.0.0.1:<port> → 127.0.0.1:<target>, with a target the test switches."""

    def __init__(self) -> None:
        self._target: int | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        #: What the servers wrote, per relayed connection.
        self._captures: list[Capture] = []
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def point_at(self, port: int | None) -> None:
        """Forward new connections to `port`; None holds them until a port is set."""
        with self._lock:
            self._target = port

    def hold(self) -> None:
        self.point_at(None)

    def captures(self) -> list[Capture]:
        """Every relayed connection so far (copies)."""
        with self._lock:
            return [
                Capture(bytearray(c.sent), bytearray(c.received), c.ended_by_server)
                for c in self._captures
            ]

    def cut_response(self, marker: bytes) -> bytes | None:
        """What the server had written of the last response on the connection that carried
        `marker` in a request and that the server side ended (it died mid-response)."""
        for capture in self.captures():
            if capture.ended_by_server and marker in capture.sent:
                requests = len(re.findall(rb"(?:^|\n)(?:GET|POST|DELETE) /", capture.sent))
                responses = capture.received.split(b"HTTP/1.1 ")
                if len(responses) - 1 < requests:
                    return b""  # it died before even the status line
                return bytes(responses[-1])
        return None

    def _current(self) -> int | None:
        with self._lock:
            return self._target

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accepted, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        backend: asyncio.StreamWriter | None = None
        try:
            opened = await self._connect()
            if opened is None:
                return
            backend_reader, backend = opened
            capture = Capture()
            with self._lock:
                self._captures.append(capture)
            upstream = asyncio.ensure_future(_copy(reader, backend, capture.sent))
            downstream = asyncio.ensure_future(_copy(backend_reader, writer, capture.received))
            copies = [upstream, downstream]
            try:
                done, _ = await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
                capture.ended_by_server = downstream in done
            finally:
                for copy in copies:
                    copy.cancel()
                await asyncio.gather(*copies, return_exceptions=True)
        finally:
            for end in (writer, backend):
                if end is not None:
                    end.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await end.wait_closed()
            self._tasks.discard(task)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Connect to the current target, waiting while there is none or it refuses."""
        deadline = time.monotonic() + HOLD_TIMEOUT
        while time.monotonic() < deadline:
            target = self._current()
            if target is not None:
                try:
                    return await asyncio.open_connection("127.0.0.1", target)
                except OSError:
                    pass  # the server died, and the test has not noticed yet
            await asyncio.sleep(0.02)
        return None

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


async def _copy(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, seen: bytearray | None = None
) -> None:
    with contextlib.suppress(OSError):
        while data := await source.read(65536):
            if seen is not None and len(seen) < 1 << 20:
                seen.extend(data)
            sink.write(data)
            await sink.drain()


@contextlib.contextmanager
def relay() -> Iterator[Relay]:
    made = Relay()
    try:
        yield made
    finally:
        made.close()


# -- processes -----------------------------------------------------------------------------


async def died(server: LockgateServer, timeout: float = 60.0) -> int:
    """The exit status of a server that is dying (polled, without blocking the loop)."""
    deadline = time.monotonic() + timeout
    while (code := server.exited()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"server {server.name} still alive after {timeout:g} s")
        await asyncio.sleep(0.02)
    return code


async def eventually(
    condition: Callable[[], object], what: str = "", timeout: float = 30.0
) -> None:
    """Poll `condition` (a quick blocking check) until truthy, without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or condition}")
        await asyncio.sleep(0.05)


async def replace(
    deployment: Deployment, hub: Relay, old: LockgateServer, name: str, **env: str
) -> LockgateServer:
    """Once `old` is dead: hold the relay, start `name`, and forward to it once ready."""
    await died(old)
    hub.hold()
    new = await asyncio.to_thread(deployment.start, name=name, **env)
    hub.point_at(new.port)
    return new


# -- raw HTTP --------------------------------------------------------------------------------


def execute_request(request_id: Any, code: str) -> dict[str, Any]:
    """A raw JSON-RPC `tools/call` of `execute` running `code`."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "execute", "arguments": {"code": code}},
    }


def headers(key: str, session_id: str | None = None, **extra: str) -> dict[str, str]:
    sent = {
        "Authorization": f"Bearer {key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL,
        **extra,
    }
    if session_id is not None:
        sent["Mcp-Session-Id"] = session_id
    return sent


async def raw_initialize(
    http: httpx2.AsyncClient, url: str, key: str, version: str = PROTOCOL
) -> str:
    """`initialize` and `notifications/initialized` by hand (asking for `version`); returns
    the session id."""
    response = await http.post(
        url,
        headers=headers(key),
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "1.0"},
            },
        },
    )
    assert response.status_code == 200, response.text
    [answer] = sse_messages(response.content)
    assert answer["result"]["protocolVersion"] == version
    session_id = response.headers["mcp-session-id"]
    done = await http.post(
        url,
        headers=headers(key, session_id, **{"MCP-Protocol-Version": version}),
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
    )
    assert done.status_code == 202, done.text
    return session_id


_SSE_ID = re.compile(rb"(?:^|\n)id: ")
_SSE_DATA = re.compile(rb"(?:^|\n)data: (\{[^\r\n]*\})\r?\n")


def carries_event_id(raw: bytes) -> bool:
    """Whether raw HTTP bytes (chunked SSE) carry an event with an id, such as the priming
    event a client needs to resume the stream."""
    return _SSE_ID.search(raw) is not None


def messages_in_raw(raw: bytes) -> list[Any]:
    """The JSON-RPC messages in SSE `data:` lines of raw HTTP bytes (one event per chunk, as
    the server writes them)."""
    return [json.loads(m) for m in _SSE_DATA.findall(raw)]


def lost_data(caught: pytest.ExceptionInfo[MCPError]) -> dict[str, Any]:
    """The `data` of a -32010 error (failing with the error shown when it is another)."""
    error = caught.value.error
    assert error.code == REQUEST_LOST, f"expected -32010, got {error!r}"
    assert isinstance(error.data, dict), error
    return error.data


# -- in process: the real application through ASGI -------------------------------------------

BASE = "http://127.0.0.1:8000"
URL = f"{BASE}/mcp"


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@contextlib.asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[tuple[httpx2.AsyncClient, BearerAuth]]:
    """The real application on `runtime`, its lifespan entered and boot recovery done; also
    its /mcp auth layer, whose `app` is the SessionGate (the ledger)."""
    app = create_app(runtime.settings, runtime)
    [route] = [r for r in app.router.routes if isinstance(r, Route) and r.path == "/mcp"]
    ready = route.app
    assert isinstance(ready, WhenReady)
    auth = ready.app
    assert isinstance(auth, BearerAuth) and isinstance(auth.app, SessionGate)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE) as http,
    ):
        deadline = time.monotonic() + 30
        while (await http.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "the application never became ready"
            await anyio.sleep(0.05)
        yield http, auth


def opened(runtime: Runtime, session_id: str = "s", principal: str = "alice") -> None:
    """A session whose initialize exchange is over (so idle), as the gate records one."""
    runtime.sessions.open(session_id, principal, PROTOCOL, {"name": "t", "version": "1"}, {})
    runtime.sessions.end_request(session_id)


def close_always_loses(runtime: Runtime, monkeypatch: pytest.MonkeyPatch, session_id: str) -> None:
    """Stage a close that loses every attempt: after each of its reads of the session, a
    request on it begins and ends (the writes' own reads are left alone), so the close's
    write always finds the row moved. `monkeypatch.undo()` ends it."""
    read = runtime.sessions.get
    touching: list[bool] = []

    def read_then_touch(wanted: str) -> Any:
        row = read(wanted)
        if not touching and wanted == session_id:
            touching.append(True)
            runtime.sessions.begin_request(wanted)
            runtime.sessions.end_request(wanted)
            touching.clear()
        return row

    monkeypatch.setattr(runtime.sessions, "get", read_then_touch)


def session_status(runtime: Runtime, session_id: str = "s") -> str:
    row = runtime.sessions.get(session_id)
    assert row is not None
    return row.status


def owed_status(runtime: Runtime, owed_id: str) -> str:
    row = runtime.ledger.get(owed_id)
    assert row is not None
    return row.status


def key_for(runtime: Runtime, principal: str) -> str:
    return ApiKeys(runtime.engine.store).create(principal).secret


# -- the test's own reads of the database -------------------------------------------------------


class Db:
    def __init__(self, url: str) -> None:
        self.engine: SqlEngine = open_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    def executions(self) -> list[Execution]:
        with DbSession(self.engine) as s:
            return list(s.exec(select(Execution)))

    def execution(self, execution_id: str) -> Execution:
        with DbSession(self.engine) as s:
            row = s.get(Execution, execution_id)
        assert row is not None, execution_id
        return row

    def owed(self, session_id: str) -> list[OwedRequest]:
        with DbSession(self.engine) as s:
            return list(s.exec(select(OwedRequest).where(OwedRequest.session_id == session_id)))

    def session(self, session_id: str) -> Session:
        with DbSession(self.engine) as s:
            row = s.get(Session, session_id)
        assert row is not None, session_id
        return row

    def instances(self) -> list[Instance]:
        with DbSession(self.engine) as s:
            return list(s.exec(select(Instance)))


@contextlib.contextmanager
def database(url: str) -> Iterator[Db]:
    made = Db(url)
    try:
        yield made
    finally:
        made.close()
