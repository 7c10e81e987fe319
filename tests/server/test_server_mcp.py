"""The MCP meta-tools over real HTTP, with the real `mcp` client, in both protocol eras.

Every test talks to a real `lockgate serve` process (shared by the session, one per database
kind) through `mcp.Client` over streamable HTTP on loopback: `mode="legacy"` (2025
sessions) and `mode="2026-07-28"` (stateless). Effects are checked in the notes tool's own
log, which only a call that really ran writes to.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lockgate.server.tool_listing import SOURCE_TOOLS
from tests.support.people import links_base
from tests.support.polling import wait_for
from tests.support.servers import (
    MODES,
    SharedServer,
    mcp_client,
    pause,
    run,
    settle,
    structured,
    text_of,
    unique_key,
    writes_of,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("mode", MODES)]


def test_execute_completes_with_result_and_logs(shared: SharedServer, mode: str) -> None:
    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            result = await client.call_tool(
                "execute", {"code": "print('hello')\n{'sum': 1 + 2, 'items': [1, 'two']}"}
            )
        body = structured(result)
        assert not result.is_error, body
        assert body["status"] == "completed"
        assert body["result"] == {"sum": 3, "items": [1, "two"]}
        assert body["logs"] == "hello\n"
        assert isinstance(body["executionId"], str) and body["executionId"]
        text = text_of(result)
        assert "Completed" in text
        assert '"sum": 3' in text and "hello" in text

    run(scenario())


def test_execute_that_raises_is_a_tool_error(shared: SharedServer, mode: str) -> None:
    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            result = await client.call_tool(
                "execute", {"code": "print('before')\nraise ValueError('boom at the end')"}
            )
        body = structured(result)
        assert result.is_error, body
        assert body["status"] == "error"
        assert body["executionId"]
        assert isinstance(body["error"]["code"], str) and body["error"]["code"]
        assert "ValueError" in body["error"]["message"]
        assert "boom at the end" in body["error"]["message"]
        assert body["logs"] == "before\n"
        assert "boom at the end" in text_of(result)

    run(scenario())


def test_pause_then_accept_runs_the_call_once(shared: SharedServer, mode: str) -> None:
    key = unique_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            paused = await pause(client, key)
            execution_id = paused["executionId"]
            assert datetime.fromisoformat(paused["expiresAt"]) > datetime.now(UTC)
            interaction = paused["interaction"]
            assert interaction["kind"] == "url"
            assert interaction["tool"] == "tools.notes.write"
            assert interaction["argsPreview"] == {"key": key, "text": "v"}
            assert "tools.notes.write" in interaction["message"]
            # The link names the call (on the host a loopback server's links name).
            page = f"{links_base(shared.base_url)}/approve/{execution_id}/1"
            assert interaction["approvalUrl"] == page
            assert writes_of(shared.deployment, key) == [], "nothing runs before approval"

            result = await client.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
            body = structured(result)
            assert not result.is_error, body
            assert body["status"] == "completed"
            assert body["executionId"] == execution_id
            assert body["result"] == {"written": {"key": key, "written": True}}

        [write] = writes_of(shared.deployment, key)
        assert write["idempotency_key"] == f"{execution_id}:1"
        assert write["principal_id"] == "alice"

    run(scenario())


def test_paused_answer_is_readable_as_text(shared: SharedServer, mode: str) -> None:
    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            result = await client.call_tool(
                "execute",
                {"code": f"import tools\ntools.notes.write(key={unique_key()!r}, text='v')"},
            )
            body = structured(result)
            text = text_of(result)
            assert body["executionId"] in text
            assert body["interaction"]["approvalUrl"] in text
            assert "tools.notes.write" in text
            for action in ("accept", "decline", "cancel"):
                assert action in text
            # Leave nothing waiting behind.
            await client.call_tool(
                "resume", {"executionId": body["executionId"], "action": "cancel"}
            )

    run(scenario())


@pytest.mark.parametrize(("action", "word"), [("decline", "declined"), ("cancel", "cancelled")])
def test_decline_or_cancel_raises_permission_error_in_the_code(
    shared: SharedServer, mode: str, action: str, word: str
) -> None:
    key = unique_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            paused = await pause(client, key)
            result = await client.call_tool(
                "resume", {"executionId": paused["executionId"], "action": action}
            )
        body = structured(result)
        assert not result.is_error, body
        assert body["status"] == "completed"
        refused = body["result"]["refused"]
        assert word in refused and "tools.notes.write" in refused
        assert writes_of(shared.deployment, key) == []

    run(scenario())


@pytest.mark.parametrize("resume_mode", MODES)
def test_resume_from_a_new_client(shared: SharedServer, mode: str, resume_mode: str) -> None:
    """Pause in one client (session), resume in another, possibly of the other era."""
    key = unique_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as first:
            execution_id = (await pause(first, key))["executionId"]
        async with mcp_client(shared.url, shared.alice, resume_mode) as second:
            # Without an action, a paused execution is shown as it is.
            seen = structured(await second.call_tool("resume", {"executionId": execution_id}))
            assert seen["status"] == "waiting_for_interaction", seen
            assert seen["interaction"]["argsPreview"] == {"key": key, "text": "v"}
            result = await second.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
        assert structured(result)["status"] == "completed", structured(result)
        assert len(writes_of(shared.deployment, key)) == 1

    run(scenario())


def test_resume_errors_name_the_case(shared: SharedServer, mode: str) -> None:
    key = unique_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            missing = await client.call_tool(
                "resume", {"executionId": "0123456789abcdef", "action": "accept"}
            )
            body = structured(missing)
            assert missing.is_error
            assert body["status"] == "execution_not_found"
            assert body["error"]["code"] == "not_found"
            assert "0123456789abcdef" in body["error"]["message"]
            assert "execute" in body["hint"]

            execution_id = (await pause(client, key))["executionId"]
            first = await client.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
            assert structured(first)["status"] == "completed"

            again = await client.call_tool(
                "resume", {"executionId": execution_id, "action": "decline"}
            )
            body = structured(again)
            assert again.is_error
            assert body["status"] == "execution_already_settled"
            assert body["executionId"] == execution_id
            assert "completed" in body["error"]["message"]
            assert body["hint"]

            # Without an action, a settled execution answers with its result.
            result = await client.call_tool("resume", {"executionId": execution_id})
            body = structured(result)
            assert not result.is_error, body
            assert body["status"] == "completed"
            assert body["result"] == {"written": {"key": key, "written": True}}
        assert len(writes_of(shared.deployment, key)) == 1, "a repeated decision ran nothing"

    run(scenario())


def test_an_approval_expires(short: SharedServer, mode: str) -> None:
    """LOCKGATE_APPROVAL_TTL=1: past the deadline, the decision is refused by name."""
    key = unique_key()

    async def scenario() -> None:
        async with mcp_client(short.url, short.alice, mode) as client:
            first = structured(
                await client.call_tool(
                    "execute", {"code": f"import tools\ntools.notes.write(key={key!r}, text='v')"}
                )
            )
            if first["status"] == "running":  # a 0.2 s budget on a busy machine
                first = structured(await settle(client, first["executionId"]))
            execution_id = first["executionId"]
            # On a busy machine the 1 s approval can pass while the client is still settling
            # the answer: it is then already expired, which is what the rest checks.
            if first["status"] != "execution_expired":
                assert first["status"] == "waiting_for_interaction", first
                deadline = datetime.fromisoformat(first["expiresAt"])
                wait_for(lambda: datetime.now(UTC) > deadline, "the approval deadline to pass")

            seen = await client.call_tool("resume", {"executionId": execution_id})
            body = structured(seen)
            assert seen.is_error, body
            assert body["status"] == "execution_expired"
            assert "execute" in body["hint"]

            late = await client.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
            body = structured(late)
            assert late.is_error, body
            assert body["status"] == "execution_expired"
            assert body["error"]["code"] == "expired"
            assert "expired" in body["error"]["message"]
            assert "execute" in body["hint"]
        assert writes_of(short.deployment, key) == []

    run(scenario())


ITERATIONS = 5_000_000  # about 0.6 s of sandboxed computing here; the budget is 0.2 s
BURN = f"total = 0\nfor i in range({ITERATIONS}):\n    total = total + i\ntotal"


def test_code_that_outlives_the_wait_budget_answers_running(short: SharedServer, mode: str) -> None:
    """LOCKGATE_WAIT_BUDGET_SECS=0.2 and code that computes for about half a second; the
    execution goes on, and `resume` without an action (here from another client) waits for
    its result."""

    async def scenario() -> None:
        async with mcp_client(short.url, short.alice, mode) as first:
            result = await first.call_tool("execute", {"code": BURN})
        body = structured(result)
        assert not result.is_error, body
        assert body["status"] == "running", body
        execution_id = body["executionId"]
        assert execution_id in text_of(result)
        assert "resume" in text_of(result)

        async with mcp_client(short.url, short.alice, mode) as second:
            done = await settle(second, execution_id)
        body = structured(done)
        assert not done.is_error, body
        assert body["status"] == "completed"
        assert body["executionId"] == execution_id
        assert body["result"] == sum(range(ITERATIONS))

    run(scenario())


def test_execute_description_lists_the_tools(shared: SharedServer, mode: str) -> None:
    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == {"execute", "resume", "describe_tools", *SOURCE_TOOLS}
        description = tools["execute"].description or ""
        assert "tools.notes.write(key: str, text: str)" in description
        assert "tools.notes.read(key: str)" in description
        assert "tools.notes.list()" in description
        assert tools["execute"].input_schema["required"] == ["code"]
        assert tools["resume"].input_schema["required"] == ["executionId"]

    run(scenario())


def test_describe_tools_with_a_query(shared: SharedServer, mode: str) -> None:
    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            found = await client.call_tool("describe_tools", {"query": "write"})
            nothing = await client.call_tool("describe_tools", {"query": "no-such-tool-xyz"})
            everything = await client.call_tool("describe_tools", {})
        body = structured(found)
        assert not found.is_error, body
        [write] = body["tools"]
        assert write["name"] == "tools.notes.write"
        assert write["signature"].startswith("tools.notes.write(key: str, text: str)")
        assert write["parameters"]["required"] == ["key", "text"]
        assert write["idempotent"] is False
        assert write["policy"] == "require_approval"
        assert write["description"]
        assert "tools.notes.write" in text_of(found)

        assert structured(nothing)["tools"] == []
        assert "No tool matches" in text_of(nothing)
        names = {t["name"] for t in structured(everything)["tools"]}
        assert {"tools.notes.read", "tools.notes.write", "tools.notes.list"} <= names

    run(scenario())
