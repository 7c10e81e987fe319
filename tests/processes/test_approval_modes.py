"""Who may accept a gated call: the approval mode (`model`, `native`, `browser`), the
server's, overridden per principal by the operator, made stricter (never looser) per
connection with `?approval=` on the MCP URL.

Two principals on one server: `alice` under the server's `browser`, `ci` set to `model` by
the operator. The model's own accept is refused for alice however her client asks, and
allowed for ci unless ci's connection asks for a stricter mode. Where a person must approve,
a signed-in approver decides: neither the agent's key nor its approval link can.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest

from lockgate.machine.approval_modes import ApprovalMode, ApprovalModes, InvalidApprovalMode
from tests.support.people import approver_at, links_base
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    pause,
    run,
    structured,
    text_of,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


def test_the_principal_s_mode_and_a_stricter_connection_decide() -> None:
    modes = ApprovalModes.from_text("browser", "ci=model, bot=native")
    assert modes.for_principal("alice") is ApprovalMode.BROWSER
    assert modes.for_principal("ci") is ApprovalMode.MODEL
    # A connection may tighten its principal's mode ...
    assert modes.for_connection("ci", "native") is ApprovalMode.NATIVE
    assert modes.for_connection("bot", "browser") is ApprovalMode.BROWSER
    # ... never loosen it.
    assert modes.for_connection("alice", "model") is ApprovalMode.BROWSER
    assert modes.for_connection("bot", "model") is ApprovalMode.NATIVE
    with pytest.raises(InvalidApprovalMode, match="unknown approval mode 'trust-me'"):
        modes.for_connection("alice", "trust-me")
    with pytest.raises(InvalidApprovalMode, match="is not principal=mode"):
        ApprovalModes.from_text("native", "ci")


def test_the_model_cannot_accept_where_a_person_must(deployment: Deployment) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="browser", LOCKGATE_APPROVAL_MODES="ci=model")
    alice = create_key_directly(deployment.database_url, "alice")
    ci = create_key_directly(deployment.database_url, "ci")

    async def accept(url: str, key: str, note: str) -> tuple[dict[str, Any], Any]:
        async with mcp_client(url, key, "legacy") as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            paused = await pause(client, note)
            answer = await client.call_tool(
                "resume", {"executionId": paused["executionId"], "action": "accept"}
            )
            return listed, answer

    # alice: refused, even when her connection asks for the model's mode.
    for suffix in ("", "?approval=model"):
        listed, refused = run(accept(server.url + suffix, alice, f"alice{len(suffix)}"))
        assert refused.is_error, structured(refused)
        assert structured(refused)["error"]["code"] == "forbidden"
        assert "A person must approve this call (approval mode browser)" in text_of(refused)
        # Her listing never offers what she cannot do.
        schema = listed["resume"].input_schema["properties"]["action"]
        assert schema["enum"] == ["decline", "cancel"]
        assert "you cannot accept" in (listed["execute"].description or "")
    assert writes_of(deployment, "alice0") == [] and writes_of(deployment, "alice15") == []

    # ci (the operator made it `model`): its accept is the approval.
    listed, done = run(accept(server.url, ci, "ci"))
    assert not done.is_error and structured(done)["status"] == "completed", structured(done)
    assert listed["resume"].input_schema["properties"]["action"]["enum"][0] == "accept"
    assert len(writes_of(deployment, "ci")) == 1
    # Its audit record names the door, the actor (the model, by its principal's key, no
    # person) and the client.
    [record] = deployment.audit_lines("ci")
    assert (record["action"], record["door"]) == ("accept", "resume")
    assert (record["by"], record["actor"]) == ("model", "the model (ci's key)")
    assert record["person"] is None
    assert isinstance(record["client"], dict) and record["client"]["name"]
    # ... unless its connection asks a person to approve.
    _, refused = run(accept(server.url + "?approval=native", ci, "ci-native"))
    assert "approval mode native" in text_of(refused)
    assert "or in your client's prompt" in text_of(refused)

    async def give_up_and_bad_mode() -> None:
        async with mcp_client(server.url, alice, "2026-07-28") as client:
            paused = await pause(client, "alice-gives-up")
            # Declining needs nobody's leave.
            declined = await client.call_tool(
                "resume", {"executionId": paused["executionId"], "action": "decline"}
            )
            assert not declined.is_error, structured(declined)
            assert structured(declined)["status"] == "completed"
        async with mcp_client(server.url + "?approval=trust-me", alice, "legacy") as client:
            bad = await client.call_tool("execute", {"code": "1"})
            assert bad.is_error
            assert "unknown approval mode 'trust-me'" in text_of(bad)

    run(give_up_and_bad_mode())
    assert writes_of(deployment, "alice-gives-up") == []


def test_browser_mode_holds_across_a_restart(deployment: Deployment) -> None:
    first = deployment.start(name="first", LOCKGATE_APPROVAL_MODE="browser")
    key = create_key_directly(deployment.database_url, "alice")

    async def paused() -> dict[str, Any]:
        async with mcp_client(first.url, key, "legacy") as client:
            return await pause(client, "browser-restart")

    waiting = run(paused())
    assert first.kill() == -signal.SIGKILL
    second = deployment.start(name="second", LOCKGATE_APPROVAL_MODE="browser")
    execution_id = waiting["executionId"]

    url = waiting["interaction"]["approvalUrl"]
    # The link from before the restart names the call (on the host links name); it
    # authorises nothing: opened without a person signed in, it asks for one, and sent as
    # a credential, it is refused.
    path = urlsplit(url).path
    assert url == f"{links_base(first.base_url)}{path}" and path.startswith(
        f"/approve/{execution_id}/"
    )
    with httpx2.Client(timeout=30) as http:
        opened = http.get(f"{links_base(second.base_url)}{path}")
        assert opened.status_code == 303, opened.text
        assert opened.headers["location"].startswith("/signin?next=")
        as_link = http.post(
            f"{second.base_url}/api/executions/{execution_id}/resume",
            headers={"X-Approval-Token": path.removeprefix("/approve/")},
            json={"action": "accept"},
        )
        assert as_link.status_code == 401, as_link.text
        assert as_link.json()["error"]["code"] == "unauthorized"

    async def try_then_collect() -> tuple[Any, Any]:
        async with mcp_client(second.url, key, "2026-07-28") as client:
            refused = await client.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
            # A person who approves alice's calls decides on the page.
            with approver_at(deployment.database_url, second.base_url, ["alice"], "Ann") as ann:
                decided = await asyncio.to_thread(ann.approve, url)
                assert decided.status_code == 200, decided.text
            done = await client.call_tool("resume", {"executionId": execution_id})
            return refused, done

    refused, done = run(try_then_collect())
    assert refused.is_error and "approval mode browser" in text_of(refused)
    assert structured(done)["status"] == "completed", structured(done)
    assert len(writes_of(deployment, "browser-restart")) == 1
    [record] = deployment.audit_lines("alice")
    assert (record["action"], record["door"], record["actor"]) == ("accept", "approval_page", "Ann")
    assert record["by"] == "person" and record["person"]["name"] == "Ann"
    assert record["person"]["signedInWith"] == "passkey"
