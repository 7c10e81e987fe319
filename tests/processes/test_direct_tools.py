"""Direct tools: a source the operator exposes with `expose = "direct"` has its tools listed
as MCP tools of their own beside `execute`, each call a one-call execution through the same
journal, policy and approvals. Tested on a real `lockgate serve` with the real SDK client
in both protocol eras, and across a SIGKILL while a call waits for approval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPDeprecationWarning

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.registry import ToolRegistry
from lockgate.machine.tools.source_file import load_sources
from lockgate.server.direct_tools import DirectTools, result_of
from tests.support.conformance_tools import IMAGE, SCHEMA_2020_12, make_source
from tests.support.direct_servers import (  # noqa: F401  (fixture)
    FACTORY,
    direct_settings,
    sqlite_deployment_fixture,
)
from tests.support.greeter_plugin import make_source as make_greeter
from tests.support.mcp_calls import MODES, mcp_client, run, settle, structured, text_of
from tests.support.server_deployment import Deployment


@pytest.mark.parametrize("mode", MODES)
def test_a_directly_exposed_source_s_tools_are_listed_and_answer_as_mcp_content(
    deployment: Deployment, tmp_path: Path, mode: str
) -> None:
    server = deployment.start(
        **direct_settings(tmp_path, tmp_path / "effects"),
    )
    [key] = server.printed_keys()

    async def scenario() -> None:
        async with mcp_client(server.url, key, mode) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert {"execute", "resume", "test_image_content", "confirm_delete"} <= set(listed)
            # The schema as published: 2020-12 keywords kept, not rewritten.
            assert listed["json_schema_2020_12_tool"].input_schema == SCHEMA_2020_12

            image = await client.call_tool("test_image_content", {})
            assert not image.is_error, image
            [part] = image.content
            assert isinstance(part, types.ImageContent), image
            assert (part.data, part.mime_type) == (IMAGE, "image/png")

            mixed = await client.call_tool("test_multiple_content_types", {})
            assert [p.type for p in mixed.content] == ["text", "image", "resource"], mixed

            failed = await client.call_tool("test_error_handling", {})
            assert failed.is_error
            assert text_of(failed) == "This tool intentionally returns an error for testing"

            # The tool's own schema is checked before the call, in words.
            refused = await client.call_tool("confirm_delete", {"filename": ""})
            assert refused.is_error and "filename" in text_of(refused), refused

    run(scenario())


def test_a_direct_call_that_needs_approval_waits_durably_and_is_made_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    settings = direct_settings(tmp_path, effects)
    server = deployment.start(**settings)
    [key] = server.printed_keys()

    async def ask() -> str:
        async with mcp_client(server.url, key, "legacy") as client:
            result = await client.call_tool("confirm_delete", {"filename": "report.txt"})
            paused = structured(result)
            assert paused["status"] == "waiting_for_interaction", paused
            assert paused["interaction"]["tool"] == "tools.conformance.confirm_delete"
            assert paused["interaction"]["argsPreview"] == {"filename": "report.txt"}
            return str(paused["executionId"])

    execution_id = run(ask())
    assert not effects.exists()  # nothing is deleted before a person approved
    server.kill()
    again = deployment.start_at(server.port, **settings)

    async def approve() -> None:
        async with mcp_client(again.url, key, "2026-07-28") as client:
            accepted = await client.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
            done = structured(await settle(client, execution_id)) if not accepted.is_error else {}
            assert done.get("status") == "completed", (accepted, done)
            assert done["result"] == "Deleted report.txt."

    run(approve())
    [line] = effects.read_text().splitlines()
    assert line == f"{execution_id}:1 report.txt"


def test_a_source_is_exposed_directly_only_when_its_table_says_so(tmp_path: Path) -> None:
    path = tmp_path / "sources.toml"
    path.write_text(f'[[python]]\nfactory = "{FACTORY}"\nexpose = "direct"\n')
    assert load_sources(path, HttpLimits()).direct == {"conformance"}
    path.write_text(f'[[python]]\nfactory = "{FACTORY}"\n')
    assert load_sources(path, HttpLimits()).direct == frozenset()
    path.write_text(f'[[python]]\nfactory = "{FACTORY}"\nexpose = "mcp"\n')
    with pytest.raises(InvalidToolSource) as refused:
        load_sources(path, HttpLimits())
    assert "expose must be 'code' or 'direct', not 'mcp'" in refused.value.message


def test_a_direct_tool_may_not_take_the_name_of_another_tool() -> None:
    registry = ToolRegistry()
    registry.register(make_source())
    registry.register(make_greeter())
    tools = DirectTools(registry, frozenset({"conformance"}), ("execute",))
    # Only the source exposed directly: the greeter's greet is not the one listed.
    assert "confirm_delete" in tools and tools.specs["greet"].source == "conformance"
    with pytest.raises(InvalidToolSource) as refused:
        DirectTools(registry, frozenset({"conformance"}), ("test_simple_text",))
    assert "'test_simple_text' has the name of a tool of Lockgate itself" in str(
        refused.value.message
    )
    with pytest.raises(InvalidToolSource) as clash:
        DirectTools(registry, frozenset({"conformance", "greeter"}), ())
    assert "its tool 'greet' has the name of tools.conformance.greet" in str(clash.value.message)


def test_a_tool_s_answer_becomes_mcp_content_by_its_shape() -> None:
    assert result_of("hi").content == [types.TextContent(type="text", text="hi")]
    as_json = result_of({"id": 7})
    assert as_json.structured_content == {"id": 7}
    assert text_of(as_json) == '{"id": 7}'
    # A list that is not of typed parts is JSON, not content.
    listed = result_of([{"type": "row", "id": 1}])
    assert text_of(listed) == '[{"type": "row", "id": 1}]'
    assert listed.structured_content is None
    resource = result_of(
        [{"type": "resource", "uri": "test://r", "mime_type": "text/plain", "text": "body"}]
    )
    [part] = resource.content
    assert isinstance(part, types.EmbeddedResource)
    assert part.resource.model_dump(by_alias=True, exclude_none=True) == {
        "uri": "test://r",
        "mimeType": "text/plain",
        "text": "body",
    }


def test_what_a_tool_says_while_it_runs_reaches_its_caller_at_the_level_asked(
    deployment: Deployment, tmp_path: Path
) -> None:
    server = deployment.start(
        **direct_settings(tmp_path, tmp_path / "effects"),
    )
    [key] = server.printed_keys()
    said: list[Any] = []

    async def heard(params: types.LoggingMessageNotificationParams) -> None:
        if params.logger == "lockgate.tools":  # not the session's own notices
            said.append((params.level, params.data))

    async def scenario() -> None:
        async with mcp_client(server.url, key, "legacy", logging_callback=heard) as client:
            heard_progress: list[tuple[float, float | None]] = []

            async def moved(progress: float, total: float | None, message: str | None) -> None:
                heard_progress.append((progress, total))

            await client.call_tool("test_tool_with_progress", {}, progress_callback=moved)
            assert heard_progress == [(0, 100), (50, 100), (100, 100)]
            await client.call_tool("test_tool_with_logging", {})
            assert said == [
                ("info", "Tool execution started"),
                ("info", "Tool processing data"),
                ("info", "Tool execution completed"),
            ]
            # From code too: the same call through execute is heard the same way.
            said.clear()
            await client.call_tool(
                "execute", {"code": "tools.conformance.test_tool_with_logging()"}
            )
            assert len(said) == 3
            # A client that asked for warnings and above hears no info. (The SDK warns that
            # 2026-07-28 drops logging/setLevel; a 2025 session still speaks it.)
            with pytest.warns(MCPDeprecationWarning):
                await client.set_logging_level("warning")
            said.clear()
            await client.call_tool("test_tool_with_logging", {})
            assert said == []

    run(scenario())
