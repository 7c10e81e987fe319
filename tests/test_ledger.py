"""The owed-request ledger: every request a POST owes is answered, or reported lost (-32010)
with what became of its execution.

In-process tests drive the real application (`server.app.create_app`) through ASGI, or the
`Sessions` core with a fake clock. Real-process tests run `lockgate serve` on loopback
(SQLite file and PostgreSQL), send real signals (SIGTERM, SIGKILL), and talk raw HTTP where
the wire is the point, or the real `mcp` client in legacy (2025) mode.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError

from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.lost_report import request_key
from lockgate.machine.runtime import Runtime
from lockgate.server.owed_response import DrainSignal
from lockgate.server.session_gate import SessionGate
from lockgate.spec import CrashPoint
from lockgate.spec import ExecutionStatus as E
from tests.support.servers import (  # noqa: F401  (fixture: deployment)
    Deployment,
    create_key_directly,
    deployment_fixture,
    mcp_client,
    run,
    structured,
)
from tests.support.sessions import (
    PROTOCOL,
    REQUEST_LOST,
    URL,
    FakeClock,
    database,
    died,
    eventually,
    headers,
    key_for,
    lost_data,
    opened,
    raw_initialize,
    relay,
    replace,
    serving,
)
from tests.support.sse import sse_messages


def compute(iterations: int) -> str:
    """Sandboxed code that computes for a while (no tool calls) and returns a number."""
    return f"total = 0\nfor i in range({iterations}):\n    total = total + i\ntotal"


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


# -- real processes ----------------------------------------------------------------------------

#: About two seconds of sandboxed computing here (no tool calls): longer than the 1 s
#: response deadline, and long enough to be caught running by a signal.
LONG = compute(20_000_000)
LONG_TOTAL = sum(range(20_000_000))


def execute_request(request_id: Any, code: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "execute", "arguments": {"code": code}},
    }


def resume_request(request_id: Any, execution_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "resume", "arguments": {"executionId": execution_id}},
    }


async def outcome_of(client: Any, execution_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """`resume` without an action until the execution is no longer running. A -32010 (the
    response deadline passed while waiting) says to ask again: next `wait`, or `fetch` when
    the execution ended just as the deadline fired."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = await client.call_tool("resume", {"executionId": execution_id})
        except MCPError as exc:
            assert exc.error.code == REQUEST_LOST, exc.error
            data = exc.error.data
            assert isinstance(data, dict) and data["executionId"] == execution_id, data
            assert data["next"] in ("wait", "fetch"), data
            continue
        body = structured(result)
        if body["status"] != "running":
            return body
    pytest.fail(f"execution {execution_id} still running after {timeout:g} s")


def running_execution(db: Any, code: str) -> str | None:
    for row in db.executions():
        if row.code == code and row.status == E.RUNNING:
            return str(row.id)
    return None


def test_a_passed_response_deadline_is_answered_32010_on_the_same_stream(
    deployment: Deployment,
) -> None:
    """LOCKGATE_RESPONSE_DEADLINE_SECS=1 with a 60 s wait budget and code that computes for
    about two seconds: the POST's own SSE stream carries -32010 for its id (and nothing
    else) and ends; the execution goes on, and `resume` without an action (from the real
    client) later returns it completed. The real client's own `execute` gets the same."""
    key = create_key_directly(deployment.database_url, "alice")
    server = deployment.start(
        name="a",
        LOCKGATE_RESPONSE_DEADLINE_SECS="1",
        LOCKGATE_WAIT_BUDGET_SECS="60",
    )

    async def raw() -> tuple[httpx2.Response, str]:
        async with httpx2.AsyncClient(timeout=30) as http:
            session_id = await raw_initialize(http, server.url, key)
            response = await http.post(
                server.url, headers=headers(key, session_id), json=execute_request(7, LONG)
            )
        return response, session_id

    async def with_client() -> tuple[dict[str, Any], dict[str, Any]]:
        async with mcp_client(server.url, key, "legacy") as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("execute", {"code": LONG})
            data = lost_data(caught)
            first = await outcome_of(client, data["executionId"])
            return data, first

    async def scenario() -> None:
        (response, session_id), (data, body) = await asyncio.gather(raw(), with_client())
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        [error] = sse_messages(response.content)  # the stream ended after it
        assert error["id"] == 7
        assert error["error"]["code"] == REQUEST_LOST
        raw_data = error["error"]["data"]
        assert raw_data["status"] == E.RUNNING and raw_data["next"] == "wait", raw_data
        assert "resume" in raw_data["hint"]

        assert data["status"] == E.RUNNING and data["next"] == "wait", data
        assert body["status"] == "completed" and body["result"] == LONG_TOTAL, body
        async with mcp_client(server.url, key, "legacy") as other:
            late = await outcome_of(other, raw_data["executionId"])
        assert late["status"] == "completed" and late["result"] == LONG_TOTAL, late
        with database(deployment.database_url) as db:
            [owed] = [row for row in db.owed(session_id) if row.request_id == 7]
            assert owed.status == "reported"

    run(scenario())


def test_sigterm_drains_answering_or_reporting_what_is_owed(deployment: Deployment) -> None:
    """A request in flight (code computing; a 60 s wait budget, far beyond the drain) when
    SIGTERM arrives: the client receives its answer or -32010 for it (never nothing), the
    process exits (SIGTERM re-raised by uvicorn after a graceful shutdown, or 0) and its
    instance row ends `stopped`; nothing is left owed. The session survives: after a
    restart the same client session fetches the execution, which the drain handed back
    (pending) and the restarted instance ran to its end."""
    key = create_key_directly(deployment.database_url, "alice")
    # Heartbeats every 0.2 s (the fixture's) keep racing the drain's own lease writes.
    deployment.settings.update(LOCKGATE_WAIT_BUDGET_SECS="60", LOCKGATE_SSE_RETRY_MS="200")

    with relay() as hub, database(deployment.database_url) as db:
        first = deployment.start(name="a1")
        hub.point_at(first.port)

        async def scenario() -> None:
            async with mcp_client(hub.url, key, "legacy") as client:
                warm = structured(await client.call_tool("execute", {"code": "1 + 1"}))
                assert warm["status"] == "completed"
                call = asyncio.create_task(client.call_tool("execute", {"code": LONG}))
                await eventually(lambda: running_execution(db, LONG), "the code to run")
                first.popen.send_signal(signal.SIGTERM)
                restarting = asyncio.create_task(replace(deployment, hub, first, "a2"))
                try:
                    answer = structured(await call)
                    execution_id = answer["executionId"]
                    # Answered before the response was cut: the code was handed back by
                    # the drain (`running`: wait for it), or it had just finished.
                    assert answer["status"] in ("running", "completed"), answer
                except MCPError as exc:
                    assert exc.error.code == REQUEST_LOST, exc.error
                    data = exc.error.data
                    assert isinstance(data, dict), exc.error
                    # Running when reported, or already handed back by the drain.
                    assert data["status"] in (E.RUNNING, E.PENDING), data
                    assert data["next"] == "wait", data
                    execution_id = data["executionId"]
                code = await died(first)
                assert code in (0, -signal.SIGTERM), f"exit {code}:\n{first.output()}"
                [row] = [i for i in db.instances() if i.id == first.instance_id]
                assert row.status == "stopped"
                session_id = db.execution(execution_id).session_id
                assert session_id is not None
                leftover = [r for r in db.owed(session_id) if r.status in ("owed", "lost")]
                assert leftover == []
                assert db.session(session_id).status in ("active", "idle")

                await restarting
                done = await outcome_of(client, execution_id)
                assert done["status"] == "completed" and done["result"] == LONG_TOTAL
                again = structured(await client.call_tool("execute", {"code": "2 + 2"}))
                assert again["result"] == 4
                assert db.execution(again["executionId"]).session_id == session_id

        run(scenario())


def test_after_a_sigkill_the_session_works_and_its_lost_id_is_reported_once(
    deployment: Deployment,
) -> None:
    """Raw HTTP, one session across a SIGKILL. The session is a row (principal, client info,
    capabilities, protocol version). A POST owes an answer (code computing, its SSE stream
    open) when the server is SIGKILLed. After a restart:
    - the same session id works without a new initialize (tools/list);
    - the session's next GET answers the lost id with -32010 (the execution was requeued,
      so next `wait`) and closes; the GET after it is the ordinary listening stream: the
      report went out exactly once; the execution then completes on `resume`;
    - an unknown id gets the spec's 404, another principal's key 403, and DELETE closes
      the session (then 404)."""
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    with database(deployment.database_url) as db:
        first = deployment.start(name="a1")

        async def scenario() -> None:
            async with httpx2.AsyncClient(timeout=30) as http:
                session_id = await raw_initialize(http, first.url, alice)
                row = db.session(session_id)
                assert row.principal_id == "alice"
                assert row.protocol_version == PROTOCOL
                assert row.client_info == {"name": "raw-test", "version": "1.0"}
                assert row.capabilities == {}

                async with http.stream(
                    "POST",
                    first.url,
                    headers=headers(alice, session_id),
                    json=execute_request("lost-1", LONG),
                ) as cut:
                    assert cut.status_code == 200
                    chunks = cut.aiter_raw()
                    primed = await anext(chunks)
                    assert primed.startswith(b"id: "), primed  # the priming event
                    await eventually(lambda: running_execution(db, LONG), "the code to run")
                    assert first.kill() == -signal.SIGKILL
                    with pytest.raises(httpx2.TransportError):
                        async for _ in chunks:
                            pass

                second = await asyncio.to_thread(deployment.start, name="a2")
                assert second.instance_id != first.instance_id
                url = second.url

                # No initialize: the id is known, so it keeps working.
                listed = await http.post(url, headers=headers(alice, session_id), json=tools_list)
                assert listed.status_code == 200, listed.text
                assert listed.headers["mcp-session-id"] == session_id
                [answer] = sse_messages(listed.content)
                names = {tool["name"] for tool in answer["result"]["tools"]}
                assert names == {"execute", "resume", "describe_tools"}

                listen = headers(alice, session_id, Accept="text/event-stream")
                async with http.stream("GET", url, headers=listen) as reported:
                    assert reported.status_code == 200
                    assert reported.headers["content-type"].startswith("text/event-stream")
                    body = await reported.aread()  # the stream closes after the report
                [error] = sse_messages(body)
                assert error["id"] == "lost-1"
                assert error["error"]["code"] == REQUEST_LOST
                data = error["error"]["data"]
                assert data["status"] in (E.PENDING, E.RUNNING) and data["next"] == "wait"
                execution_id = data["executionId"]
                origin = db.execution(execution_id).origin_request
                assert origin == request_key(session_id, "lost-1")
                [owed] = [r for r in db.owed(session_id) if r.request_id == "lost-1"]
                assert owed.status == "reported"

                # Reported once: the next GET is the SDK's listening stream (its headers
                # name the session), not another report.
                async with http.stream("GET", url, headers=listen) as listening:
                    assert listening.status_code == 200
                    assert listening.headers.get("mcp-session-id") == session_id
                assert [r.status for r in db.owed(session_id) if r.request_id == "lost-1"] == [
                    "reported"
                ]

                deadline = time.monotonic() + 60
                while True:
                    waited = await http.post(
                        url,
                        headers=headers(alice, session_id),
                        json=resume_request(8, execution_id),
                    )
                    [answer] = sse_messages(waited.content)
                    outcome = answer["result"]["structuredContent"]
                    if outcome["status"] != "running":
                        break
                    assert time.monotonic() < deadline, "the requeued execution never ended"
                assert outcome["status"] == "completed" and outcome["result"] == LONG_TOTAL

                unknown = await http.post(url, headers=headers(alice, "0" * 32), json=tools_list)
                assert unknown.status_code == 404, unknown.text
                assert unknown.json()["error"]["code"] == -32600
                foreign = await http.post(url, headers=headers(bob, session_id), json=tools_list)
                # Answered exactly like an unknown id: no existence oracle.
                assert foreign.status_code == 404, foreign.text
                assert foreign.json() == unknown.json()

                closed = await http.delete(url, headers=headers(alice, session_id))
                assert closed.status_code == 200, closed.text
                gone = await http.post(url, headers=headers(alice, session_id), json=tools_list)
                assert gone.status_code == 404, gone.text
                assert gone.json()["error"]["code"] == -32600
                assert db.session(session_id).status == "closed"

        run(scenario())
