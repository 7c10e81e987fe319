"""A session's next request is told what it missed: a request lost while the client's prompt
was open (its connection dropped), and an approval about to expire. Real servers, a raw
client that drops its connection as a real one would, and the SDK client's logging
callback, which is where a real client surfaces `notifications/message`."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import mcp_types as types
import pytest

from lockgate.machine.db.migrate import prepare_database
from lockgate.machine.db.store import SqlStore
from lockgate.machine.settings import Settings
from lockgate.spec import OwedRequestStatus
from tests.support.polling import wait_for
from tests.support.raw_mcp import RawMCP
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    run,
    structured,
    write_code,
)
from tests.support.sse import sse_messages

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


def _notices(response: httpx2.Response) -> list[dict[str, Any]]:
    return [
        m["params"]["data"]
        for m in sse_messages(response.text)
        if m.get("method") == "notifications/message"
    ]


def _lost_in(database_url: str, session_id: str) -> bool:
    store = SqlStore(prepare_database(Settings(database_url=database_url)))
    try:
        rows = store.sessions.of_session(session_id, OwedRequestStatus.LOST)
        return any(row.method == "tools/call" for row in rows)
    finally:
        store.engine.dispose()


def test_a_prompt_whose_connection_dropped_is_told_on_the_next_request(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native", LOCKGATE_RESPONSE_DEADLINE_SECS="2")
    key = create_key_directly(deployment.database_url, "alice")
    with httpx2.Client(timeout=30) as http:
        raw = RawMCP(http, server.url, key, "legacy")
        opened = raw.initialize({"elicitation": {"form": {}}}, "drops-its-connection")
        assert opened.status_code == 200, opened.text
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": write_code("dropped")}},
        }
        asked: dict[str, Any] = {}
        with http.stream("POST", server.url, headers=raw.headers("tools/call"), json=call) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and "elicitation/create" in line:
                    asked = json.loads(line[5:])
                    break  # the connection drops with the prompt open
        assert asked["params"]["mode"] == "form", asked
        session_id = raw.session_id
        assert session_id is not None
        wait_for(lambda: _lost_in(deployment.database_url, session_id), "the request lost")

        told = _notices(raw.request("tools/list"))
        [notice] = told
        execution_id = notice["executionId"]
        assert notice["lostRequestId"] == 7 and notice["next"] == "resume", notice
        assert f"Execution {execution_id} is paused for approval" in notice["message"]
        # Told once; the call still waits for another door.
        assert _notices(raw.request("tools/list")) == []
    store = SqlStore(prepare_database(Settings(database_url=deployment.database_url)))
    try:
        row = store.executions.get(execution_id)
        assert row is not None and row.status == "waiting_for_interaction"
    finally:
        store.engine.dispose()


def test_an_approval_about_to_expire_is_told_to_the_session_that_asked(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_TTL="300", LOCKGATE_APPROVAL_WARNING="600")
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    heard: list[Any] = []

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(params)

    async def alice_asks() -> str:
        async with mcp_client(server.url, alice, "legacy", logging_callback=log) as client:
            paused = structured(await client.call_tool("execute", {"code": write_code("expiring")}))
            assert paused["status"] == "waiting_for_interaction", paused
            await client.list_tools()
            await client.list_tools()
            return str(paused["executionId"])

    execution_id = run(alice_asks())
    [warning] = heard  # told once, on the request after the pause
    assert warning.level == "warning" and warning.logger == "lockgate"
    assert warning.data["executionId"] == execution_id and warning.data["next"] == "resume"
    assert "expires at" in warning.data["message"]

    others: list[Any] = []

    async def other_log(params: types.LoggingMessageNotificationParams) -> None:
        others.append(params)

    async def bob_lists() -> None:
        async with mcp_client(server.url, bob, "legacy", logging_callback=other_log) as client:
            await client.list_tools()

    run(bob_lists())
    assert others == []  # another principal's session hears nothing of alice's approval


def test_a_session_s_log_level_is_kept_and_honoured_after_a_restart(
    deployment: Deployment,
) -> None:
    """`logging` is declared; `logging/setLevel` to `error` silences the session's warnings,
    on a restarted server too (the level is on the session's row); back to `warning`, they
    are told again."""
    settings = {"LOCKGATE_APPROVAL_TTL": "300", "LOCKGATE_APPROVAL_WARNING": "600"}
    first = deployment.start(name="first", **settings)
    key = create_key_directly(deployment.database_url, "alice")
    with httpx2.Client(timeout=30) as http:
        raw = RawMCP(http, first.url, key, "legacy")
        opened = raw.initialize()
        assert opened.status_code == 200, opened.text
        [init] = [m for m in sse_messages(opened.text) if "result" in m] or [opened.json()]
        assert "logging" in init["result"]["capabilities"], init
        paused = raw.call_tool("execute", {"code": write_code("quiet")})
        assert "waiting_for_interaction" in paused.text, paused.text
        [warning] = _notices(raw.request("tools/list"))  # an approval about to expire
        assert "expires at" in warning["message"]

        set_level = raw.request("logging/setLevel", {"level": "error"})
        assert set_level.status_code == 200 and '"result":{}' in set_level.text.replace(
            " ", ""
        ), set_level.text
        first.kill()

        second = deployment.start(name="second", **settings)
        raw.url = second.url
        # A new process would tell the warning again: the session asked for errors only.
        assert _notices(raw.request("tools/list")) == []
        # Back to warnings: told again, from the answer to that very request on, once.
        lowered = raw.request("logging/setLevel", {"level": "warning"})
        [again] = _notices(lowered) + _notices(raw.request("tools/list"))
        assert again["executionId"] == warning["executionId"]
