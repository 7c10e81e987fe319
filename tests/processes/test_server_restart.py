"""A paused execution survives its server: SIGKILL, a new process on the same database, and
a new client resumes it. On PostgreSQL, any instance resumes what another paused.

Each test starts and kills real `lockgate serve` processes, so it covers both protocol eras
in one run (one paused execution per era) instead of paying for the processes twice.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from sqlmodel import Session, col, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Execution, Instance, ToolCall, TransitionLog
from tests.support.polling import wait_for
from tests.support.servers import (
    MODES,
    Deployment,
    LockgateServer,
    create_key_directly,
    mcp_client,
    pause,
    run,
    structured,
    unique_key,
    writes_of,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


def pause_in_each_mode(server: LockgateServer, key: str) -> dict[str, tuple[str, str]]:
    """One paused write per protocol era: mode -> (execution id, note key)."""

    async def scenario() -> dict[str, tuple[str, str]]:
        paused = {}
        for mode in MODES:
            note = unique_key()
            async with mcp_client(server.url, key, mode) as client:
                paused[mode] = ((await pause(client, note))["executionId"], note)
        return paused

    return run(scenario())


def accept_in_each_mode(
    server: LockgateServer, key: str, paused: dict[str, tuple[str, str]]
) -> None:
    async def scenario() -> None:
        for mode, (execution_id, note) in paused.items():
            async with mcp_client(server.url, key, mode) as client:
                seen = structured(await client.call_tool("resume", {"executionId": execution_id}))
                assert seen["status"] == "waiting_for_interaction", (mode, seen)
                assert seen["interaction"]["argsPreview"] == {"key": note, "text": "v"}
                result = await client.call_tool(
                    "resume", {"executionId": execution_id, "action": "accept"}
                )
                body = structured(result)
                assert not result.is_error, (mode, body)
                assert body["status"] == "completed", (mode, body)
                assert body["result"] == {"written": {"key": note, "written": True}}

    run(scenario())


def assert_written_once_by(
    deployment: Deployment, paused: dict[str, tuple[str, str]], server: LockgateServer
) -> None:
    for execution_id, note in paused.values():
        [write] = writes_of(deployment, note)
        assert write["idempotency_key"] == f"{execution_id}:1"
        assert write["pid"] == server.pid


def rows(database_url: str, query: Any) -> list[Any]:
    """The test's own read of the database the servers share."""
    engine = open_engine(database_url)
    try:
        with Session(engine) as s:
            return list(s.exec(query))
    finally:
        engine.dispose()


def instance_status(database_url: str, instance_id: str | None) -> str:
    [row] = rows(database_url, select(Instance).where(Instance.id == instance_id))
    return str(row.status)


def events(database_url: str, record_id: str) -> list[str]:
    query = select(TransitionLog).where(TransitionLog.record_id == record_id)
    return [t.event for t in rows(database_url, query.order_by(col(TransitionLog.id)))]


def assert_stored_pauses(deployment: Deployment, paused: dict[str, tuple[str, str]]) -> None:
    """What the killed server left in the database: each pause, with its snapshot and the
    call it waits on, and nothing dispatched."""
    for execution_id, _ in paused.values():
        [row] = rows(deployment.database_url, select(Execution).where(Execution.id == execution_id))
        assert (row.status, row.snapshot_call) == ("waiting_for_interaction", 1), row
        assert row.snapshot, "the pause was stored without its snapshot"
        query = select(ToolCall).where(ToolCall.execution_id == execution_id)
        calls = rows(deployment.database_url, query)
        assert [(c.seq, c.tool, c.status) for c in calls] == [
            (1, "notes.write", "awaiting_approval")
        ]


def test_a_pause_survives_sigkill_and_a_new_process(deployment: Deployment) -> None:
    key = create_key_directly(deployment.database_url, "alice")
    first = deployment.start(name="first")
    paused = pause_in_each_mode(first, key)
    assert first.kill() == -signal.SIGKILL
    # It died, it did not stop: its instance row still says live (a stop records `stopped`).
    assert instance_status(deployment.database_url, first.instance_id) == "live"
    assert_stored_pauses(deployment, paused)
    assert all(writes_of(deployment, note) == [] for _, note in paused.values())

    # The same instance name: the new incarnation recovers the killed one's work at once.
    second = deployment.start(name="second")
    assert second.instance_id != first.instance_id
    assert instance_status(deployment.database_url, first.instance_id) == "dead"
    assert first.instance_id is not None
    assert "declare_dead" in events(deployment.database_url, first.instance_id)
    accept_in_each_mode(second, key, paused)
    assert_written_once_by(deployment, paused, second)
    for execution_id, _ in paused.values():
        trail = ["request_approval", "approve", "dispatch", "succeed"]
        assert events(deployment.database_url, f"{execution_id}:1") == trail

    # A repeated decision (a client retrying) answers the same outcome and runs nothing again.
    async def again() -> None:
        for mode, (execution_id, note) in paused.items():
            async with mcp_client(second.url, key, mode) as client:
                result = await client.call_tool(
                    "resume", {"executionId": execution_id, "action": "accept"}
                )
                body = structured(result)
                assert body["status"] == "completed", (mode, body)
                assert body["result"] == {"written": {"key": note, "written": True}}

    run(again())
    assert_written_once_by(deployment, paused, second)


def test_another_instance_resumes_what_a_killed_one_paused(
    deployment: Deployment, database_url: str
) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("several instances share a PostgreSQL database; SQLite is one box")
    key = create_key_directly(deployment.database_url, "alice")
    # Two instances on one database, started side by side.
    a = deployment.spawn(name="a", LOCKGATE_INSTANCE_NAME="a")
    b = deployment.spawn(name="b", LOCKGATE_INSTANCE_NAME="b")
    a.wait_ready()
    b.wait_ready()
    assert a.instance_id != b.instance_id

    paused = pause_in_each_mode(a, key)
    assert a.kill() == -signal.SIGKILL
    assert_stored_pauses(deployment, paused)
    accept_in_each_mode(b, key, paused)
    assert_written_once_by(deployment, paused, b)
    # b, the live instance, declares a dead once its lease lapses (1 s here).
    wait_for(
        lambda: instance_status(deployment.database_url, a.instance_id) == "dead",
        "the live instance to declare the killed one dead",
    )
    assert instance_status(deployment.database_url, b.instance_id) == "live"
