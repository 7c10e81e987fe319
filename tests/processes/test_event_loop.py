"""`LOCKGATE_EVENT_LOOP`: `lockgate serve` runs on uvloop and httptools by default, on the
standard library's loop and h11 when asked, and serves a durable execution either way; a
value it does not know is refused before anything serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockgate.spec import ExecutionStatus as E
from tests.support.servers import (
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

pytest_plugins = ["tests.support.servers"]


def loaded(server: LockgateServer) -> set[str]:
    """Which of the fast loop's and parser's native libraries the server process mapped."""
    maps = Path(f"/proc/{server.pid}/maps").read_text()
    return {name for name in ("uvloop", "httptools") if f"/{name}/" in maps}


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(None, {"uvloop", "httptools"}), ("auto", {"uvloop", "httptools"}), ("asyncio", set())],
)
def test_the_server_runs_on_the_event_loop_it_is_set_to(
    deployment: Deployment, setting: str | None, expected: set[str]
) -> None:
    server = deployment.start(**({} if setting is None else {"LOCKGATE_EVENT_LOOP": setting}))
    key = create_key_directly(deployment.database_url, "alice")
    note = unique_key()

    async def approved_write() -> dict[str, object]:
        async with mcp_client(server.url, key, "legacy") as client:
            paused = await pause(client, note)
            arguments = {"executionId": paused["executionId"], "action": "accept"}
            return structured(await client.call_tool("resume", arguments))

    done = run(approved_write())
    assert done["status"] == E.COMPLETED, done
    assert len(writes_of(deployment, note)) == 1
    assert loaded(server) == expected


def test_an_unknown_event_loop_is_refused_in_words(deployment: Deployment) -> None:
    server = deployment.spawn(LOCKGATE_EVENT_LOOP="trio")
    assert server.wait_exit() == 2, server.output()
    assert "LOCKGATE_EVENT_LOOP" in server.stderr(), server.stderr()
    assert "Traceback" not in server.stderr()
    assert server.printed_keys() == []
