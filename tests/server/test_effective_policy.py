"""Tool listings say what the server's configured policy does with each call.

A server started with `LOCKGATE_POLICY` that blocks one tool and auto-approves another whose
default is to ask for approval: `execute`'s description and `describe_tools` (read through the
real MCP client over HTTP, in both protocol eras) must show the decision `Policy.decide` makes
under that policy, and the calls themselves must then behave as listed.
"""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.machine.policy import Policy, PolicyDecision
from lockgate.machine.tools.notes import DELETE, LIST, READ, WRITE
from tests.support.servers import (
    MODES,
    Deployment,
    mcp_client,
    run,
    structured,
    text_of,
    unique_key,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

#: write asks for approval by default and delete too: the policy loosens one, blocks the other.
POLICY = "notes.write=approve,notes.delete=block"
EXPECTED = {
    "tools.notes.write": ("approve", "auto-approved"),
    "tools.notes.delete": ("block", "blocked by policy"),
    "tools.notes.read": ("approve", "auto-approved"),
    "tools.notes.list": ("approve", "auto-approved"),
}


def test_the_expectations_are_what_the_policy_decides() -> None:
    # The listing must agree with the engine's decision, so the expectations come from it.
    policy = Policy.from_text(POLICY)
    assert WRITE.default_policy is PolicyDecision.REQUIRE_APPROVAL
    assert DELETE.default_policy is PolicyDecision.REQUIRE_APPROVAL
    for spec in (WRITE, DELETE, READ, LIST):
        assert policy.decide(spec).value == EXPECTED[spec.call_name][0], spec.call_name


def listed_line(description: str, call_name: str) -> str:
    [line] = [line for line in description.splitlines() if line.startswith(f"- {call_name}(")]
    return line


def check_listing(tools: dict[str, Any], described: dict[str, Any], text: str) -> None:
    description = tools["execute"].description or ""
    by_name = {entry["name"]: entry for entry in described["tools"]}
    # The server's own source tools keep their defaults: adding a source waits for a person.
    assert by_name["tools.lockgate.add_openapi_source"]["policy"] == "require_approval"
    assert by_name["tools.lockgate.list_sources"]["policy"] == "approve"
    notes = {name for name in by_name if name.startswith("tools.notes.")}
    assert notes == set(EXPECTED), by_name
    for call_name, (decision, words) in EXPECTED.items():
        line = listed_line(description, call_name)
        assert words in line, line
        assert by_name[call_name]["policy"] == decision, by_name[call_name]
        assert words in by_name[call_name]["signature"], by_name[call_name]
        [text_line] = [t for t in text.splitlines() if t.startswith(f"{call_name}(")]
        assert words in text_line, text_line
    # What the defaults would have said is gone for both tools the policy changed.
    for call_name in ("tools.notes.write", "tools.notes.delete"):
        assert "requires approval" not in listed_line(description, call_name)
        assert "requires approval" not in by_name[call_name]["signature"]


def test_listings_show_the_configured_policy(deployment: Deployment) -> None:
    server = deployment.start(LOCKGATE_POLICY=POLICY)
    [key] = server.printed_keys()

    async def scenario(mode: str) -> None:
        note = unique_key()
        async with mcp_client(server.url, key, mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            described = await client.call_tool("describe_tools", {})
            assert not described.is_error, structured(described)
            check_listing(tools, structured(described), text_of(described))

            # And the calls do what the listing said: the write runs at once, the delete is
            # refused without running.
            wrote = await client.call_tool(
                "execute", {"code": f"tools.notes.write(key={note!r}, text='x')"}
            )
            assert structured(wrote)["status"] == "completed", structured(wrote)
            deleted = await client.call_tool(
                "execute",
                {
                    "code": "try:\n"
                    f"    tools.notes.delete(key={note!r})\n"
                    "    outcome = 'deleted'\n"
                    "except PermissionError as exc:\n"
                    "    outcome = str(exc)\n"
                    "outcome\n"
                },
            )
            body = structured(deleted)
            assert body["status"] == "completed", body
            assert "blocked" in body["result"], body
        assert len(writes_of(deployment, note)) == 1
        assert not [e for e in deployment.effects() if e["tool"] == "notes.delete"]

    for mode in MODES:
        run(scenario(mode))
