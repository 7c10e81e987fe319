"""Clients nobody here wrote, end to end against a real `lockgate serve`: the official
TypeScript SDK client (npm, pinned, run with the machine's node), the MCP Inspector's
command line (npm, pinned), and the Python SDK in each protocol era. Each lists the tools,
executes code that pauses for approval, sees the server SIGKILLed and restarted, and then
resumes: the TypeScript client from the same session and from a new one, the others from a
new connection; a decline is caught by the code; a browser approval (a signed-in approver
of the principal, deciding the call the link names through the page's API) is followed by a
resume that collects the result. The notes tool's own log shows every approved write made
exactly once and no declined one, and the audit records name who decided each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.inspector_cli import inspect, inspector_fixture  # noqa: F401  (fixture)
from tests.support.npm import NODE
from tests.support.people import approver_at
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    run,
    structured,
    unique_key,
    write_code,
    writes_of,
)
from tests.support.typescript_sdk import TS_CLIENT, ts_sdk_fixture  # noqa: F401  (fixture)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

#: One call of a client: (tool, arguments, session to reuse or None) -> (structured answer,
#: the session it was made on, when the client has one).
Call = Callable[[str, dict[str, Any], str | None], tuple[dict[str, Any], str | None]]


def typescript(sdk: Path, url: str, key: str) -> Call:
    def call(
        tool: str, arguments: dict[str, Any], session: str | None
    ) -> tuple[dict[str, Any], str | None]:
        steps = json.dumps([{"tool": tool, "arguments": arguments}])
        done = subprocess.run(
            [str(NODE), str(TS_CLIENT / "steps.mjs"), url, key, session or "-", steps],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "LOCKGATE_TS_SDK": str(sdk)},
        )
        events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        assert done.returncode == 0 and len(events) == 2, f"{events}\n{done.stderr}"
        connected, answer = events
        assert answer["event"] == "answer", answer
        return answer["result"]["structuredContent"], connected["sessionId"]

    return call


def inspector_client(executable: Path, url: str, key: str) -> Call:
    def call(
        tool: str, arguments: dict[str, Any], session: str | None
    ) -> tuple[dict[str, Any], str | None]:
        pairs = [f"{name}={value}" for name, value in arguments.items()]
        answer = inspect(
            executable, url, key, "tools/call", "--tool-name", tool, "--tool-arg", *pairs
        )
        assert not answer.get("isError"), answer
        return answer["structuredContent"], None

    return call


def python_sdk(url: str, key: str, mode: str) -> Call:
    def call(
        tool: str, arguments: dict[str, Any], session: str | None
    ) -> tuple[dict[str, Any], str | None]:
        async def once() -> dict[str, Any]:
            async with mcp_client(url, key, mode) as client:
                return structured(await client.call_tool(tool, arguments))

        return run(once()), None

    return call


def browser_approves(deployment: Deployment, base_url: str, paused: dict[str, Any]) -> None:
    """What the approval page does when a signed-in approver of alice's calls presses
    Approve on the page the answer's link names."""
    with approver_at(deployment.database_url, base_url, ["alice"], "Ann") as ann:
        decided = ann.approve(paused["interaction"]["approvalUrl"])
        assert decided.status_code == 200, decided.text


def through_a_restart(
    deployment: Deployment,
    client: Callable[[str], Call],
    list_tools: Callable[[str], list[str]],
    *,
    same_session: bool,
) -> None:
    first = deployment.start(name="first")
    port = first.port
    call = client(first.url)
    assert {"execute", "resume"} <= set(list_tools(first.url))
    approved, declined, by_page = unique_key(), unique_key(), unique_key()
    one, session = call("execute", {"code": write_code(approved)}, None)
    two, _ = call("execute", {"code": write_code(declined)}, None)
    assert one["status"] == two["status"] == "waiting_for_interaction", (one, two)
    assert first.kill() == -signal.SIGKILL

    second = deployment.start_at(port, name="second")
    call = client(second.url)
    reuse = session if same_session else None
    done, again = call("resume", {"executionId": one["executionId"], "action": "accept"}, reuse)
    assert done["status"] == "completed", done
    assert done["result"] == {"written": {"key": approved, "written": True}}
    if same_session:
        assert again == session  # the same session, served by the new process
    refused, _ = call("resume", {"executionId": two["executionId"], "action": "decline"}, None)
    assert refused["status"] == "completed", refused
    assert "declined" in refused["result"]["refused"]

    paused, _ = call("execute", {"code": write_code(by_page)}, None)
    assert paused["status"] == "waiting_for_interaction", paused
    browser_approves(deployment, second.base_url, paused)
    collected, _ = call("resume", {"executionId": paused["executionId"]}, None)
    assert collected["status"] == "completed", collected

    assert len(writes_of(deployment, approved)) == 1
    assert writes_of(deployment, declined) == []
    assert len(writes_of(deployment, by_page)) == 1
    # The model decided through `resume` (approval mode `model`), the person on the page.
    deciders = {
        line["executionId"]: (
            line["action"],
            line["door"],
            line["by"],
            line["actor"],
            line["person"],
        )
        for line in deployment.audit_lines("alice")
    }
    model = "the model (alice's key)"
    assert deciders[one["executionId"]] == ("accept", "resume", "model", model, None)
    assert deciders[two["executionId"]] == ("decline", "resume", "model", model, None)
    action, door, by, actor, person = deciders[paused["executionId"]]
    assert (action, door, by, actor) == ("accept", "approval_page", "person", "Ann")
    assert person is not None and person["name"] == "Ann"


def test_the_typescript_sdk_client_across_a_restart(deployment: Deployment, ts_sdk: Path) -> None:
    key = create_key_directly(deployment.database_url, "alice")

    def list_tools(url: str) -> list[str]:
        steps = json.dumps([{"method": "tools/list"}])
        done = subprocess.run(
            [str(NODE), str(TS_CLIENT / "steps.mjs"), url, key, "-", steps, "close"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "LOCKGATE_TS_SDK": str(ts_sdk)},
        )
        [_, answer] = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        return [tool["name"] for tool in answer["result"]["tools"]]

    through_a_restart(
        deployment, lambda url: typescript(ts_sdk, url, key), list_tools, same_session=True
    )


def test_the_inspector_cli_across_a_restart(deployment: Deployment, inspector: Path) -> None:
    key = create_key_directly(deployment.database_url, "alice")

    def list_tools(url: str) -> list[str]:
        return [tool["name"] for tool in inspect(inspector, url, key, "tools/list")["tools"]]

    through_a_restart(
        deployment,
        lambda url: inspector_client(inspector, url, key),
        list_tools,
        same_session=False,
    )


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_python_sdk_across_a_restart(deployment: Deployment, mode: str) -> None:
    key = create_key_directly(deployment.database_url, "alice")

    def list_tools(url: str) -> list[str]:
        async def listed() -> list[str]:
            async with mcp_client(url, key, mode) as client:
                return [tool.name for tool in (await client.list_tools()).tools]

        return run(listed())

    through_a_restart(
        deployment, lambda url: python_sdk(url, key, mode), list_tools, same_session=False
    )
