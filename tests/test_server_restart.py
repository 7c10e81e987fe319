"""A paused execution survives its server: SIGKILL, a new process on the same database, and
a new client resumes it. On PostgreSQL, any instance resumes what another paused.

Each test starts and kills real `lockgate serve` processes, so it covers both protocol eras
in one run (one paused execution per era) instead of paying for the processes twice.
"""

from __future__ import annotations

import signal

import pytest

from tests.server_fixtures import (
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
pytest_plugins = ["tests.server_fixtures"]

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


def test_a_pause_survives_sigkill_and_a_new_process(deployment: Deployment) -> None:
    key = create_key_directly(deployment.database_url, "alice")
    first = deployment.start(name="first")
    paused = pause_in_each_mode(first, key)
    assert first.kill() == -signal.SIGKILL
    assert all(writes_of(deployment, note) == [] for _, note in paused.values())

    # The same instance name: the new incarnation recovers the killed one's work at once.
    second = deployment.start(name="second")
    accept_in_each_mode(second, key, paused)
    assert_written_once_by(deployment, paused, second)

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
    accept_in_each_mode(b, key, paused)
    assert_written_once_by(deployment, paused, b)
