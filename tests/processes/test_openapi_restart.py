"""An approval-gated OpenAPI write survives its server: a real `lockgate serve` with a
sources file pauses the write, is SIGKILLed, a new process starts on the same database, and a
new client (another session, another protocol era) approves it. The API, a real HTTP server
on loopback, receives the write exactly once, after the approval, with its call's
idempotency key."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_api import ItemsApi, RunningApi, serve, sources_file
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    run,
    structured,
    text_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

WRITE = 'tools.items.create_item(body={"name": "pen", "price": 2.5})'


@pytest.fixture(name="api")
def api_fixture() -> Iterator[RunningApi]:
    yield from serve(ItemsApi())


def test_a_paused_openapi_write_survives_sigkill_and_completes_from_another_session(
    deployment: Deployment, api: RunningApi, tmp_path: Path
) -> None:
    sources = sources_file(tmp_path, api)
    key = create_key_directly(deployment.database_url, "alice")
    first = deployment.start(name="first", LOCKGATE_SOURCES_FILE=str(sources))

    async def pause() -> str:
        async with mcp_client(first.url, key, "legacy") as client:
            body = structured(await client.call_tool("execute", {"code": WRITE}))
            assert body["status"] == "waiting_for_interaction", body
            assert body["interaction"]["tool"] == "tools.items.create_item", body
            return str(body["executionId"])

    execution_id = run(pause())
    assert first.kill() == -signal.SIGKILL
    assert api.api.effects == []  # nothing reached the API before the decision

    second = deployment.start(name="second", LOCKGATE_SOURCES_FILE=str(sources))

    async def approve() -> None:
        async with mcp_client(second.url, key, "2026-07-28") as client:
            seen = structured(await client.call_tool("resume", {"executionId": execution_id}))
            assert seen["status"] == "waiting_for_interaction", seen
            assert seen["interaction"]["argsPreview"] == {"body": {"name": "pen", "price": 2.5}}
            done = structured(
                await client.call_tool("resume", {"executionId": execution_id, "action": "accept"})
            )
            assert done["status"] == "completed", done
            assert done["result"] == {"id": 1, "name": "pen", "price": 2.5, "tags": []}
            # A repeated decision answers the same outcome and sends nothing again.
            again = structured(
                await client.call_tool("resume", {"executionId": execution_id, "action": "accept"})
            )
            assert again["status"] == "completed", again

    run(approve())
    assert api.api.effects == [{"created": 1}]
    assert api.api.idempotency_keys == [f"{execution_id}:1"]


def test_a_paused_add_openapi_source_survives_sigkill_and_completes_from_another_session(
    deployment: Deployment, api: RunningApi
) -> None:
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    # The API alice adds listens on loopback, which the operator allows for principals' sources.
    loopback = {"LOCKGATE_SOURCE_ALLOWED_NETWORKS": "127.0.0.0/8"}
    first = deployment.start(name="first", **loopback)
    arguments = {"name": "items", "document": json.dumps(api.document), "base_url": api.url}

    async def pause() -> str:
        async with mcp_client(first.url, alice, "legacy") as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert "add_openapi_source" in listed, listed
            # Arguments that can only fail start nothing, and say what is wrong.
            bad = await client.call_tool("add_openapi_source", {"name": "items"})
            assert bad.is_error, bad
            assert "argument 'document' is required" in text_of(bad), text_of(bad)
            body = structured(await client.call_tool("add_openapi_source", arguments))
            assert body["status"] == "waiting_for_interaction", body
            assert body["interaction"]["tool"] == "tools.lockgate.add_openapi_source", body
            return str(body["executionId"])

    execution_id = run(pause())
    assert first.kill() == -signal.SIGKILL
    second = deployment.start(name="second", **loopback)

    async def approve() -> None:
        async with mcp_client(second.url, alice, "2026-07-28") as client:
            done = structured(
                await client.call_tool("resume", {"executionId": execution_id, "action": "accept"})
            )
            assert done["status"] == "completed", done
            assert done["result"] == {
                "name": "items",
                "kind": "openapi",
                "scope": "own",
                "tools": 10,
            }
            found = await client.call_tool("describe_tools", {"query": "list items"})
            assert "tools.items.list_items(" in found.content[0].text  # type: ignore[union-attr]
            read = structured(
                await client.call_tool("execute", {"code": "tools.items.list_items()"})
            )
            assert read["status"] == "completed", read
            assert read["result"] == []

    run(approve())

    async def other_principal() -> None:
        async with mcp_client(second.url, bob, "legacy") as client:
            found = await client.call_tool("describe_tools", {"query": "list items"})
            # Bob's search ranks only his own tools: alice's items are not among them.
            assert "tools.items" not in found.content[0].text  # type: ignore[union-attr]

    run(other_principal())
