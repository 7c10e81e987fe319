"""A SIGKILL mid-`execute`, with the clients people run, with their default settings.

One `lockgate serve` process on a fixed port; at once, each client sends an `execute` whose
code computes for a few seconds:
- the official TypeScript SDK client (npm `@modelcontextprotocol/sdk` 1.32.2, installed here
  from the registry and run with the machine's node), which offers 2025-11-25;
- the official Python SDK client (`mcp`), on a 2025-11-25 session (`mode="legacy"`);
- the Python SDK client on the stateless 2026-07-28 protocol, with an `idempotencyKey`.
While all three run, the server is SIGKILLed, kept down for 1, 10 or 30 s, and started again
on the same port (no relay in between: the clients reconnect to what is there). Then:
- both session clients' pending calls end with -32010 whose message names the execution and
  the next step (never a client timeout, never the SDK's own reconnect failure);
- the stateless client, which has no session to collect a report on, sends the same
  `execute` again with its key and gets that execution's result (no second execution).

The outage is a real interval of wall-clock time, the thing under test, not a sleep that
hides a race: every other wait here polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from lockgate.simulation.ports import free_port
from lockgate.spec import ExecutionStatus as E
from tests.support.npm import NODE
from tests.support.servers import (  # noqa: F401  (fixture: deployment)
    Deployment,
    create_key_directly,
    deployment_fixture,
    run,
    settle,
    structured,
)
from tests.support.sessions import REQUEST_LOST, database, eventually
from tests.support.typescript_sdk import TS_CLIENT, ts_sdk_fixture  # noqa: F401  (fixture)

ITERATIONS = 30_000_000
#: Sandboxed code that computes for a few seconds (no tool calls): long enough to be caught
#: running by the kill on every client, short enough to run again after the restart.
LONG = f"total = 0\nfor i in range({ITERATIONS}):\n    total = total + i\ntotal"
LONG_TOTAL = sum(range(ITERATIONS))
#: The longest a client may take to end its call: the TypeScript client times a call out
#: at 60 s, and a report must come before that.
CLIENT_PATIENCE = 90.0
#: The 2025 versions a Python SDK session offers here: its own (2025-11-25), and the two
#: before it, as clients built on older SDK releases offer them.
SESSION_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
ROOT = TS_CLIENT.parents[2]

pytestmark = pytest.mark.slow


@dataclass
class Lost:
    """What a client's pending call ended with: the JSON-RPC error it received."""

    client: str
    code: int | None
    message: str
    data: Any
    seconds: float


def sdk_client(url: str, http: httpx2.AsyncClient, mode: str) -> Client:
    """The Python SDK's client as its docs show it: its own HTTP client factory (the MCP
    default timeouts), a Bearer key, streamable HTTP."""
    return Client(streamable_http_client(url, http_client=http), mode=mode)


async def typescript_execute(url: str, key: str, sdk: Path) -> Lost | dict[str, Any]:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(NODE),
        str(TS_CLIENT / "lost_execute.mjs"),
        url,
        key,
        LONG,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LOCKGATE_TS_SDK": str(sdk)},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLIENT_PATIENCE)
    except TimeoutError:
        process.kill()
        pytest.fail("the TypeScript client's call did not end")
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    ended = [e for e in events if e["event"] in ("answer", "error")]
    assert ended, f"the TypeScript client printed {events}; stderr:\n{err.decode()}"
    [last] = ended
    if last["event"] == "answer":
        return dict(last["result"])
    return Lost(
        "typescript", last["code"], last["message"], last["data"], time.monotonic() - started
    )


async def python_session_execute(url: str, key: str, version: str) -> Lost | dict[str, Any]:
    """The Python SDK client on a session offering `version`, in a process of its own
    (`tests/support/procs/python_execute.py`)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.procs.python_execute",
        url,
        key,
        version,
        LONG,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLIENT_PATIENCE)
    except TimeoutError:
        process.kill()
        pytest.fail(f"the Python client's call ({version}) did not end")
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    assert lines, f"the Python client ({version}) printed nothing; stderr:\n{err.decode()}"
    outcome = json.loads(lines[-1])
    assert outcome["protocolVersion"] == version, outcome
    if "answer" in outcome:
        return dict(outcome["answer"])
    error = outcome["error"]
    return Lost(
        f"python {version}", error["code"], error["message"], error["data"], outcome["seconds"]
    )


async def stateless_execute(url: str, key: str, idempotency_key: str) -> str:
    """The stateless client's first try: what it ended with (the server died under it)."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    try:
        async with (
            http,
            Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as c,
        ):
            result = await asyncio.wait_for(
                c.call_tool("execute", {"code": LONG, "idempotencyKey": idempotency_key}),
                CLIENT_PATIENCE,
            )
            return f"answered: {structured(result)}"
    except Exception as exc:  # what it is depends on where the stream broke; any is a loss
        return f"lost: {type(exc).__name__}"
    except BaseExceptionGroup as group:
        return f"lost: {group!r}"


async def stateless_reissue(url: str, key: str, idempotency_key: str) -> dict[str, Any]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with http, sdk_client(url, http, "2026-07-28") as c:
        again = await c.call_tool("execute", {"code": LONG, "idempotencyKey": idempotency_key})
        body = structured(again)
        if body["status"] == "running":
            body = structured(await settle(c, body["executionId"], timeout=60))
        return body


def assert_reported(lost: Lost | dict[str, Any], execution_id: str) -> None:
    assert isinstance(lost, Lost), f"the call was answered, not lost: {lost}"
    assert lost.code == REQUEST_LOST, lost
    # The message alone (what most hosts show a model) names the execution and what to do.
    assert execution_id in lost.message, lost.message
    assert f"executionId={execution_id}" in lost.message and "resume" in lost.message, lost
    assert isinstance(lost.data, dict) and lost.data["executionId"] == execution_id, lost
    assert lost.data["status"] in (E.PENDING, E.RUNNING, E.COMPLETED), lost.data
    assert lost.data["next"] in ("wait", "fetch"), lost.data


@pytest.mark.parametrize("outage", [1, 10, 30], ids=lambda s: f"down-{s}s")
def test_every_client_learns_what_became_of_an_execute_cut_off_by_a_sigkill(
    deployment: Deployment, ts_sdk: Path, outage: int
) -> None:
    if deployment.database_url.startswith("postgresql") and outage != 10:
        pytest.skip("one outage on PostgreSQL: what the clients see does not hang on the database")
    principals = ("typescript", *(f"python-{v}" for v in SESSION_VERSIONS), "python-2026")
    keys = {name: create_key_directly(deployment.database_url, name) for name in principals}
    idempotency_key = uuid.uuid4().hex
    port = free_port()
    # A sandbox worker for every client's code at once (the default is 4).
    workers = {"LOCKGATE_SANDBOX_WORKERS": str(len(principals))}
    first = deployment.start_at(port, name="first", **workers)
    url = first.url

    def running_of(db: Any) -> dict[str, str]:
        return {
            row.principal_id: row.id
            for row in db.executions()
            if row.code == LONG and row.status == E.RUNNING
        }

    async def scenario() -> None:
        with database(deployment.database_url) as db:
            ts = asyncio.create_task(typescript_execute(url, keys["typescript"], ts_sdk))
            sessions = {
                version: asyncio.create_task(
                    python_session_execute(url, keys[f"python-{version}"], version)
                )
                for version in SESSION_VERSIONS
            }
            stateless = asyncio.create_task(
                stateless_execute(url, keys["python-2026"], idempotency_key)
            )
            await eventually(
                lambda: len(running_of(db)) == len(principals), "every client's code to run"
            )
            executions = running_of(db)
            assert first.kill() == -signal.SIGKILL
            down_since = time.monotonic()
            assert (await stateless).startswith("lost"), "the stateless call was answered"
            await asyncio.sleep(outage - (time.monotonic() - down_since))  # the outage
            second = await asyncio.to_thread(deployment.start_at, port, name="second", **workers)
            assert second.url == url

            assert_reported(await ts, executions["typescript"])
            for version, client in sessions.items():
                assert_reported(await client, executions[f"python-{version}"])
            again = await stateless_reissue(url, keys["python-2026"], idempotency_key)
            assert again["executionId"] == executions["python-2026"], again
            assert again["status"] == "completed" and again["result"] == LONG_TOTAL, again
            mine = [row for row in db.executions() if row.principal_id == "python-2026"]
            assert len(mine) == 1, "the re-issued execute started a second execution"

    run(scenario())
