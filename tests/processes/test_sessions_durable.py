"""Durable 2025-protocol MCP sessions, across REAL restarts and instances.

The real-process tests run `lockgate serve` on loopback (SQLite file and PostgreSQL), kill
it with real signals (SIGKILL from a crash point armed with LOCKGATE_CRASH_AT), and talk to
it with the real `mcp` client in legacy (2025) mode. (Raw-HTTP checks of the same session
surviving a SIGKILL, 404/403/DELETE, live in test_ledger_processes.py next to the report
they share.)

The client has one URL for its whole life: a loopback relay (tests/support/sessions.py)
forwards it to whichever server is current and holds new connections while none is, as a
load balancer in front of a restarting fleet would. The servers suggest a 200 ms SSE retry,
so the client's reconnecting GET arrives at once; the relay makes it wait for the restarted
server's readiness instead of burning its two reconnection attempts on a closed port.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from mcp import MCPError
from sqlmodel import Session as DbSession
from sqlmodel import select

from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.runtime import Runtime
from lockgate.spec import ExecutionStatus as E
from tests.support.servers import (  # noqa: F401  (fixture: deployment)
    Deployment,
    create_key_directly,
    deployment_fixture,
    mcp_client,
    run,
    settle,
    structured,
    writes_of,
)
from tests.support.sessions import (
    PROTOCOL,
    URL,
    FakeClock,
    carries_event_id,
    database,
    died,
    eventually,
    headers,
    key_for,
    lost_data,
    messages_in_raw,
    raw_initialize,
    relay,
    replace,
    serving,
)

pytestmark = pytest.mark.slow

#: `begin` inserts and claims the execution in one transaction: dying before its commit
#: leaves nothing at all (no execution, no effect).
NOTHING_RAN = "execution:start:pending->running:before_commit"
#: The write's effect happened, its result was never recorded: in doubt, so interrupted.
WRITE_RAN = "tool_call:dispatch:approved->dispatched:after_effect"
#: An idempotent read was made at once, then the process died before its journal entry
#: was committed: recovery runs the code again from its last checkpoint.
LIST_MADE = "tool_call:succeed_at_least_once:requested->succeeded:after_effect"

#: Sandboxed computing that outlasts the restart's report (about 1-2 s here), so the
#: requeued execution is still pending or running when the lost request is reported.
ITERATIONS = 12_000_000
LIST_THEN_COMPUTE = (
    "keys = tools.notes.list()\n"
    "total = 0\n"
    f"for i in range({ITERATIONS}):\n"
    "    total = total + i\n"
    "{'keys': keys, 'total': total}\n"
)

#: Every server: approved writes run without a person, and clients reconnect fast.
SETTINGS = {"LOCKGATE_POLICY": "notes.write=approve", "LOCKGATE_SSE_RETRY_MS": "200"}


def configure(deployment: Deployment) -> str:
    """The settings every server here gets; returns alice's API key."""
    deployment.settings.update(SETTINGS)
    return create_key_directly(deployment.database_url, "alice")


def owing(db: Any) -> list[OwedRequest]:
    """Ledger entries still owed (on any session: each test's database has one)."""
    with DbSession(db.engine) as s:
        return list(s.exec(select(OwedRequest).where(OwedRequest.status == "owed")))


def completed(result: Any) -> dict[str, Any]:
    body = structured(result)
    assert not result.is_error, body
    assert body["status"] == "completed", body
    return body


def test_sigkill_mid_execute_is_reported_on_the_same_session(deployment: Deployment) -> None:
    """The Done-when scenario, twice on ONE session: the server is SIGKILLed mid `execute`
    (at a crash point) and restarted under the same instance name; the client's same session
    receives -32010 for the lost id with the execution's fate in `data`, and goes on calling
    tools on that session. The first restart is armed with the second crash (a session that
    lived through one crash must get the next report right too: the client's resuming GET
    left over from the first crash must not swallow it):
      1. a write ran and its result was lost: `interrupted`, whatRan naming the call in
         doubt, next `check`; `resume` answers execution_interrupted; a new execute works;
      2. an idempotent read was made: the execution is requeued and running again,
         next `wait`; `resume` without an action returns its completed result.
    """
    key = configure(deployment)
    note = "done-when-note"

    with relay() as hub, database(deployment.database_url) as db:
        first = deployment.start(name="a1", LOCKGATE_CRASH_AT=WRITE_RAN)
        hub.point_at(first.port)

        async def scenario() -> None:
            async with mcp_client(hub.url, key, "legacy") as client:
                assert client.protocol_version == PROTOCOL
                assert (
                    completed(await client.call_tool("execute", {"code": "6 * 7"}))["result"] == 42
                )

                # 1. A write ran; its outcome was never recorded.
                restarting = asyncio.create_task(
                    replace(deployment, hub, first, "a2", LOCKGATE_CRASH_AT=LIST_MADE)
                )
                code = f"tools.notes.write(key={note!r}, text='v')\n'written'"
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("execute", {"code": code})
                second = await restarting
                assert first.exited() == -9
                data = lost_data(caught)
                execution_id = data["executionId"]
                assert isinstance(execution_id, str) and execution_id, data
                assert data["status"] == E.INTERRUPTED, data
                assert data["next"] == "check", data
                assert data["requestMethod"] == "tools/call"
                assert data["hint"], data
                what_ran = data["whatRan"]
                assert [c["tool"] for c in what_ran["calls"]] == ["notes.write"], what_ran
                assert [c["tool"] for c in what_ran["in_doubt"]] == ["notes.write"], what_ran
                assert len(writes_of(deployment, note)) == 1  # it did run, once

                resumed = await client.call_tool("resume", {"executionId": execution_id})
                body = structured(resumed)
                assert resumed.is_error, body
                assert body["status"] == "execution_interrupted", body
                assert body["executionId"] == execution_id
                assert body["error"]["what_ran"] == what_ran
                assert len(writes_of(deployment, note)) == 1  # never repeated
                assert (
                    completed(await client.call_tool("execute", {"code": "'still here'"}))["result"]
                    == "still here"
                )

                # 2. An idempotent read was made: the execution runs again.
                restarting = asyncio.create_task(replace(deployment, hub, second, "a3"))
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("execute", {"code": LIST_THEN_COMPUTE})
                await restarting
                assert second.exited() == -9
                data = lost_data(caught)
                execution_id = data["executionId"]
                assert isinstance(execution_id, str) and execution_id, data
                assert data["status"] in (E.PENDING, E.RUNNING), data
                assert data["next"] == "wait", data
                assert "whatRan" not in data
                body = completed(await settle(client, execution_id))
                assert body["executionId"] == execution_id
                assert body["result"]["keys"] == [note]
                assert body["result"]["total"] == sum(range(ITERATIONS))

        run(scenario())

        assert_one_session(db)


def assert_one_session(db: Any) -> None:
    """One session all along: every execution belongs to it."""
    sessions = {row.session_id for row in db.executions()}
    assert len(sessions) == 1 and None not in sessions, sessions


def test_sigkill_before_anything_ran_suggests_re_executing(deployment: Deployment) -> None:
    """Killed before the execution's first commit: nothing ran, nothing is recorded, and the
    lost request is reported with executionId None and next `re-execute` (the only case in
    which re-executing is suggested); re-executing on the same session completes.

    The relay shows what the server wrote before dying. The SDK client can only reconnect a
    POST stream that carried an event id (the priming event); the tool handler waits for
    that event before doing anything durable, so even a crash this early leaves the client
    a stream to resume, on which it reads the report as this request's answer.
    """
    key = configure(deployment)

    with relay() as hub, database(deployment.database_url) as db:
        first = deployment.start(name="a1", LOCKGATE_CRASH_AT=NOTHING_RAN)
        hub.point_at(first.port)
        outcome: dict[str, Any] = {}

        async def scenario() -> None:
            async with mcp_client(hub.url, key, "legacy") as client:
                assert {t.name for t in (await client.list_tools()).tools} >= {"execute"}
                # The ledger writes an answer, then consumes its entry (the spec's order: a
                # crash in between reports the id rather than forgetting it). The client has
                # the tools/list answer before that commit, so killing the server now could
                # report tools/list lost too: wait until only the crashing call can be owed.
                await eventually(lambda: not owing(db), "the tools/list entry to be consumed")
                restarting = asyncio.create_task(replace(deployment, hub, first, "a2"))
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("execute", {"code": "6 * 7"})
                await restarting
                assert first.exited() == -9
                outcome["error"] = caught.value.error
                assert db.executions() == [], "nothing may be recorded before the commit"
                again = completed(await client.call_tool("execute", {"code": "6 * 7"}))
                assert again["result"] == 42
                # Unless the client's resuming GET took it, the client's listening GET
                # collects the report once it reconnects (while the session lives).
                await eventually(lambda: any(r.status == "reported" for r in reported()))

        def reported() -> list[OwedRequest]:
            [session_id] = {row.session_id for row in db.executions()}
            return [row for row in db.owed(session_id or "") if row.status == "reported"]

        run(scenario())

        rows = reported()
        assert len(rows) == 1, [(r.method, r.request_id, r.status) for r in rows]
        [owed] = rows
        assert owed.method == "tools/call" and owed.execution_id is None
        # What the server wrote on the wire for it: exactly once, whichever GET took it.
        reports = [
            m
            for capture in hub.captures()
            for m in messages_in_raw(bytes(capture.received))
            if m.get("error", {}).get("code") == -32010
        ]
        assert len(reports) == 1, reports
        [report] = reports
        assert report["id"] == owed.request_id
        data = report["error"]["data"]
        assert data["executionId"] is None, data
        assert data["next"] == "re-execute", data
        assert "nothing ran" in data["hint"].lower(), data

        cut = hub.cut_response(b'"6 * 7"')
        assert cut is not None, "no connection carried the request the server died on"
        error = outcome["error"]
        # The handler waited for the stream's event id before doing anything durable, so
        # the client can always resume it and read the report as this request's answer.
        assert carries_event_id(cut), "the server died before the client could resume"
        assert error.code == -32010, error
        assert error.data == data


def test_a_session_moves_to_the_other_instance_of_a_postgres_pair(
    deployment: Deployment,
) -> None:
    """Two instances (a, b) on one PostgreSQL database. The client's session lives on a; a is
    SIGKILLed mid-execute (after a write's effect); the client's URL now leads to b. The same
    session id keeps working on b without a new initialize, the lost id is answered -32010
    with the execution's fate (interrupted once b recovered a's work after its lease
    lapsed), and the client resumes and executes on b."""
    if deployment.database_url.startswith("sqlite"):
        pytest.skip("a pair of instances shares a PostgreSQL database; SQLite is one box")
    key = configure(deployment)
    note = "pair-note"

    with relay() as hub, database(deployment.database_url) as db:
        a = deployment.spawn(name="a", LOCKGATE_INSTANCE_NAME="a", LOCKGATE_CRASH_AT=WRITE_RAN)
        b = deployment.spawn(name="b", LOCKGATE_INSTANCE_NAME="b")
        a.wait_ready()
        b.wait_ready()
        hub.point_at(a.port)

        async def fail_over() -> None:
            await died(a)
            # At once, as a load balancer would: until a's lease lapses (1 s) b reports
            # nothing, then recovery runs before the report describes the execution.
            hub.point_at(b.port)

        async def scenario() -> None:
            async with mcp_client(hub.url, key, "legacy") as client:
                assert (
                    completed(await client.call_tool("execute", {"code": "6 * 7"}))["result"] == 42
                )

                moving = asyncio.create_task(fail_over())
                code = f"tools.notes.write(key={note!r}, text='v')\n'written'"
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("execute", {"code": code})
                await moving
                assert a.exited() == -9
                data = lost_data(caught)
                execution_id = data["executionId"]
                assert isinstance(execution_id, str) and execution_id, data
                assert data["status"] == E.INTERRUPTED, data
                assert data["next"] == "check", data
                assert [c["tool"] for c in data["whatRan"]["in_doubt"]] == ["notes.write"]
                assert len(writes_of(deployment, note)) == 1

                resumed = await client.call_tool("resume", {"executionId": execution_id})
                assert structured(resumed)["status"] == "execution_interrupted"
                after = completed(await client.call_tool("execute", {"code": "'on b'"}))
                assert after["result"] == "on b"

        run(scenario())

        sessions = {row.session_id for row in db.executions()}
        assert len(sessions) == 1 and None not in sessions, sessions
        session_id = sessions.pop()
        # Opened on a, served by b from its row (a new initialize would be a new id).
        assert f"opened session {session_id}" in a.stderr()
        assert f"revived session {session_id} from its row" in b.stderr()


def test_an_expired_session_is_not_revived(make_runtime: Callable[..., Runtime]) -> None:
    """In process, with a fake clock: a session left idle past the idle timeout is destroyed
    by the next incarnation (its first sweep, which runs after ready, or the request that
    names it, whichever comes first), and its id gets the spec's 404 (no revival)."""
    clock = FakeClock()
    limits = {"heartbeat_interval": "3600", "session_idle_timeout": "60", "session_cap": "600"}
    first = make_runtime(clock=clock, instance_name="a", **limits)
    key = key_for(first, "alice")

    async def open_session() -> str:
        async with serving(first) as (http, _):
            session_id = await raw_initialize(http, URL, key)
            await eventually(
                lambda: (
                    (row := first.sessions.get(session_id)) is not None and row.status == "idle"
                ),
                "the session to go idle",
            )
            return session_id

    session_id = run(open_session())
    clock.advance(timedelta(seconds=120))
    second = make_runtime(clock=clock, instance_name="a", **limits)

    async def after_restart() -> None:
        async with serving(second) as (http, _):
            listed = await http.post(
                URL,
                headers=headers(key, session_id),
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            )
            assert listed.status_code == 404, listed.text
            assert listed.json()["error"]["code"] == -32600
            row = second.sessions.get(session_id)
            assert row is not None and row.status == "expired"

    run(after_restart())
