"""The real MCP SDK client against a server, and what the tests run through it.

`mcp_client` opens the SDK's streamable-HTTP client with a Bearer key in either protocol
era (`MODES`); the rest build agent code (`write_code`), read tool results (`structured`,
`text_of`), drive an execution to its approval pause or past `running` (`pause`,
`settle`), and read what the notes tool really wrote (`writes_of`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.server_deployment import Deployment

#: Both protocol eras: 2025 sessions, and the stateless 2026-07-28 protocol.
MODES = ["legacy", "2026-07-28"]

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one async scenario to its end (each test owns its event loop)."""
    return asyncio.run(coroutine)


@asynccontextmanager
async def mcp_client(
    url: str,
    key: str | None,
    mode: str,
    *,
    elicitation_callback: Any = None,
    logging_callback: Any = None,
) -> AsyncIterator[Client]:
    """The real SDK client over streamable HTTP, with a Bearer key (or none); with
    `elicitation_callback`, a client that declares elicitation and answers with it; with
    `logging_callback`, one that hears the server's `notifications/message`."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    finished = False
    try:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30.0) as http,
            Client(
                streamable_http_client(url, http_client=http),
                mode=mode,
                elicitation_callback=elicitation_callback,
                logging_callback=logging_callback,
            ) as client,
        ):
            yield client
            finished = True
    except BaseExceptionGroup as group:
        # The SDK client (mcp 2.3.0) sometimes fails its own teardown after a server was
        # killed under one of its streams: a request task exits an anyio cancel scope from
        # the wrong task. That happens after the test's body has run to the end, in code
        # we do not own; anything else, or anything before the end, still fails the test.
        if not finished or not _only_sdk_teardown_bug(group):
            raise


def _only_sdk_teardown_bug(group: BaseExceptionGroup) -> bool:
    def leaves(exc: BaseException) -> list[BaseException]:
        if isinstance(exc, BaseExceptionGroup):
            return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
        return [exc]

    return all(
        isinstance(leaf, RuntimeError) and "cancel scope" in str(leaf) for leaf in leaves(group)
    )


def write_code(key: str, text: str = "v") -> str:
    """Agent code whose one call (a write) needs approval; a refusal is caught by the code."""
    return (
        "import tools\n"
        "try:\n"
        f"    outcome = {{'written': tools.notes.write(key={key!r}, text={text!r})}}\n"
        "except PermissionError as exc:\n"
        "    outcome = {'refused': str(exc)}\n"
        "outcome\n"
    )


def unique_key() -> str:
    return f"note-{uuid.uuid4().hex[:10]}"


def structured(result: Any) -> dict[str, Any]:
    content = result.structured_content
    assert isinstance(content, dict), f"no structuredContent in {result!r}"
    return content


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def pause(client: Client, key: str) -> dict[str, Any]:
    """Execute a write, which must pause for approval; the paused shape."""
    result = await client.call_tool("execute", {"code": write_code(key)})
    paused = structured(result)
    assert not result.is_error, paused
    assert paused["status"] == "waiting_for_interaction", paused
    return paused


async def paused_write(url: str, key: str, note: str, mode: str = "legacy") -> dict[str, Any]:
    """A client of its own executes a write (`note`) that pauses for approval."""
    async with mcp_client(url, key, mode) as client:
        return await pause(client, note)


async def settle(client: Client, execution_id: str, timeout: float = 30.0) -> Any:
    """`resume` without an action until the execution is no longer `running`. Each call waits
    up to the server's budget, so this polls without sleeping."""
    deadline = time.monotonic() + timeout
    while True:
        result = await client.call_tool("resume", {"executionId": execution_id})
        if structured(result)["status"] != "running":
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"execution {execution_id} still running after {timeout:g} s")


def writes_of(deployment: Deployment, key: str) -> list[dict[str, Any]]:
    return [e for e in deployment.effects() if e["tool"] == "notes.write" and e["key"] == key]
