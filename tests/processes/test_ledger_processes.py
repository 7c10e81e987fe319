"""The owed-request ledger across real processes: `lockgate serve` on loopback (SQLite file
and PostgreSQL), real signals (SIGTERM, SIGKILL), raw HTTP where the wire is the point, or
the real `mcp` client in legacy (2025) mode: a passed response deadline is answered -32010
on the POST's own stream; SIGTERM drains, answering or reporting what is owed; after a
SIGKILL the session works and its lost id is reported once.

The races these tests found are pinned in process in `test_ledger.py`.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

import httpx2
import pytest
from mcp import MCPError

from lockgate.machine.lost_report import request_key
from lockgate.server.tool_listing import SOURCE_TOOLS
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
    database,
    died,
    eventually,
    execute_request,
    headers,
    lost_data,
    raw_initialize,
    relay,
    replace,
)
from tests.support.sse import sse_messages


def compute(iterations: int) -> str:
    """Sandboxed code that computes for a while (no tool calls) and returns a number."""
    return f"total = 0\nfor i in range({iterations}):\n    total = total + i\ntotal"


#: About two seconds of sandboxed computing here (no tool calls): longer than the 1 s
#: response deadline, and long enough to be caught running by a signal.
LONG = compute(20_000_000)
LONG_TOTAL = sum(range(20_000_000))


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
                # Told first what it missed (the report itself waits for a GET).
                [told, answer] = sse_messages(listed.content)
                assert told["method"] == "notifications/message", told
                assert told["params"]["data"]["lostRequestId"] == "lost-1", told
                names = {tool["name"] for tool in answer["result"]["tools"]}
                assert names == {"execute", "resume", "describe_tools", *SOURCE_TOOLS}

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


ANSWER_MARKED = "owed_request:answer:owed->answered:after_commit"


def test_an_answer_is_on_the_wire_before_its_entry_is_consumed(deployment: Deployment) -> None:
    """The server is SIGKILLed the moment the ledger has marked a response answered (a real
    crash point, LOCKGATE_CRASH_AT): the client already holds that answer, because the bytes
    are written as the mark's effect, before its commit. Were they written after, the client
    would hold neither the answer nor a -32010 (the entry says answered), and hang."""
    key = create_key_directly(deployment.database_url, "alice")
    server = deployment.start(
        name="marked", LOCKGATE_FAULT_INJECTION="true", LOCKGATE_CRASH_AT=ANSWER_MARKED
    )

    async def scenario() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            session_id = await raw_initialize(http, server.url, key)
            received = bytearray()
            async with http.stream(
                "POST",
                server.url,
                headers=headers(key, session_id),
                json=execute_request("marked-1", "6 * 7"),
            ) as response:
                assert response.status_code == 200
                with contextlib.suppress(httpx2.TransportError):
                    async for chunk in response.aiter_raw():
                        received.extend(chunk)
            assert await died(server) == -signal.SIGKILL  # at the mark, after the answer
        answers = [m for m in sse_messages(bytes(received)) if m.get("id") == "marked-1"]
        assert [a["result"]["structuredContent"]["result"] for a in answers] == [42], received
        with database(deployment.database_url) as db:
            [owed] = [row for row in db.owed(session_id) if row.request_id == "marked-1"]
            assert owed.status == "answered"

    run(scenario())
