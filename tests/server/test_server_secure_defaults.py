"""Secure defaults of `lockgate serve`: it never listens beyond loopback without API keys;
on loopback, a first start with no key creates one and prints it once."""

from __future__ import annotations

import signal

import pytest

from tests.support.servers import (
    MODES,
    Deployment,
    listening,
    mcp_client,
    run,
    structured,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


def key_rows(deployment: Deployment) -> list[str]:
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.settings import Settings
    from lockgate.server.keys import ApiKeys

    engine = prepare_database(Settings(database_url=deployment.database_url))
    try:
        return [key.principal_id for key in ApiKeys(SqlStore(engine)).list()]
    finally:
        engine.dispose()


def test_no_public_address_without_keys(deployment: Deployment) -> None:
    server = deployment.spawn("--host", "0.0.0.0", name="public")
    code = server.wait_exit(timeout=60)
    assert code == 2, server.output()
    message = server.stderr()
    assert "Refusing to listen on 0.0.0.0" in message
    assert "lockgate keys create" in message
    assert "Lockgate MCP server:" not in server.stdout(), "it must not announce itself"
    assert server.printed_keys() == []
    assert not listening(server.port)
    assert key_rows(deployment) == [], "no key was made behind the operator's back"


def test_first_loopback_start_prints_a_key_once(deployment: Deployment) -> None:
    first = deployment.start(name="first")
    [key] = first.printed_keys()
    assert "shown once" in first.stdout()
    assert key_rows(deployment) == ["local"]

    async def use(url: str) -> None:
        for mode in MODES:
            async with mcp_client(url, key, mode) as client:
                body = structured(await client.call_tool("execute", {"code": "6 * 7"}))
                assert (body["status"], body["result"]) == ("completed", 42), body

    run(use(first.url))
    # (0 once a graceful stop exits 0; see test_server_operations.test_sigterm_stops_gracefully)
    assert first.terminate() in (0, -signal.SIGTERM), first.output()

    second = deployment.start(name="second")
    assert second.printed_keys() == [], second.stdout()
    assert "lockgate keys create" in second.stdout()
    assert key_rows(deployment) == ["local"]
    run(use(second.url))  # the key printed by the first start still works
