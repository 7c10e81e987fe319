"""The MCP surface's own tools list exactly what they accept: each tool's input schema is
generated from the model that checks its arguments, with the server's own limits, so a client
that checks its arguments against the listing is never refused for their shape, and what
the listing forbids is refused, in words. On a real `lockgate serve`, with the real SDK
client, in both protocol eras."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.support.servers import (
    MODES,
    Deployment,
    create_key_directly,
    mcp_client,
    run,
    structured,
    text_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("mode", MODES)]

#: The server's bound on code, set for the test (LOCKGATE_MAX_CODE_CHARS).
CODE_LIMIT = 300
UNKNOWN = "0" * 32

#: Arguments on both sides of every bound the tools have.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("execute", {"code": "1"}),
    ("execute", {"code": "1" * CODE_LIMIT}),
    ("execute", {"code": "1" * (CODE_LIMIT + 1)}),
    ("execute", {"code": ""}),
    ("execute", {"code": "1", "idempotencyKey": "k" * 128}),
    ("execute", {"code": "1", "idempotencyKey": "k" * 129}),
    ("execute", {"code": "1", "timeout": 3}),
    ("resume", {"executionId": UNKNOWN}),
    ("resume", {"executionId": "e" * 64}),
    ("resume", {"executionId": "e" * 65}),
    ("resume", {"executionId": UNKNOWN, "action": "decline"}),
    ("resume", {"executionId": UNKNOWN, "action": "approve"}),
    ("resume", {"executionId": UNKNOWN, "answers": {"name": {"action": "accept"}}}),
    ("resume", {"executionId": UNKNOWN, "answers": {"name": {"action": "maybe"}}}),
    ("resume", {"executionId": UNKNOWN, "answers": {"name": {"action": "accept", "x": 1}}}),
    (
        "resume",
        {"executionId": UNKNOWN, "answers": {f"q{i}": {"action": "decline"} for i in range(11)}},
    ),
    ("describe_tools", {}),
    ("describe_tools", {"query": "n" * 200}),
    ("describe_tools", {"query": "n" * 201}),
    ("describe_tools", {"query": 3}),
    ("remove_source", {"name": 3}),
    ("remove_source", {}),
]


@pytest.fixture(name="served")
def served_fixture(deployment: Deployment) -> tuple[str, str]:
    """A server whose code bound is CODE_LIMIT: its URL, and alice's key."""
    server = deployment.start(LOCKGATE_MAX_CODE_CHARS=str(CODE_LIMIT))
    return server.url, create_key_directly(deployment.database_url, "alice")


def test_every_listed_schema_accepts_exactly_what_its_tool_accepts(
    served: tuple[str, str], mode: str
) -> None:
    url, key = served

    async def scenario() -> None:
        async with mcp_client(url, key, mode) as client:
            listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
            # The server's own bound, not a default.
            assert listed["execute"]["properties"]["code"]["maxLength"] == CODE_LIMIT
            for name, arguments in CASES:
                Draft202012Validator.check_schema(listed[name])
                listed_valid = Draft202012Validator(listed[name]).is_valid(arguments)
                result = await client.call_tool(name, arguments)
                error = structured(result).get("error") or {}
                refused = error.get("code") == "invalid_arguments"
                assert refused is not listed_valid, (name, arguments, structured(result))
                if refused:
                    assert result.is_error and text_of(result).strip()

    run(scenario())


def test_code_over_the_bound_is_refused_in_the_engine_s_words(
    served: tuple[str, str], mode: str
) -> None:
    url, key = served

    async def scenario() -> None:
        async with mcp_client(url, key, mode) as client:
            result = await client.call_tool("execute", {"code": "#" * (CODE_LIMIT + 5)})
        assert result.is_error
        assert structured(result)["error"] == {
            "code": "invalid_arguments",
            "message": f"The code is {CODE_LIMIT + 5} characters long; the limit is "
            f"{CODE_LIMIT}. Send a shorter program.",
        }

    run(scenario())
