"""A large API stays usable: a synthetic OpenAPI document of 1,000 operations (the scale of
the GitHub or Stripe documents) served by a real `lockgate serve`, read through the real MCP
client: `execute`'s description names the sources and how to search instead of listing 1,000
signatures, and `describe_tools` finds an operation by words and bounds what it lists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import MODES, Deployment, mcp_client, run, structured, text_of

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

KINDS = 500  # two operations each: 1,000


def large_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for kind in range(KINDS):
        paths[f"/widgets{kind}"] = {
            "get": {
                "operationId": f"list_widgets_{kind}",
                "summary": f"List the widgets of kind {kind}",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}}
                ],
            },
            "post": {
                "operationId": f"create_widget_{kind}",
                "summary": f"Create a widget of kind {kind}",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Widget"}}
                    },
                },
            },
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Widgets", "version": "1"},
        "servers": [{"url": "http://127.0.0.1:9/"}],  # never called here
        "paths": paths,
        "components": {
            "schemas": {
                "Widget": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                }
            }
        },
    }


def test_a_thousand_operations_are_searched_not_listed(
    deployment: Deployment, tmp_path: Path
) -> None:
    (tmp_path / "widgets.json").write_text(json.dumps(large_document()))
    sources = tmp_path / "sources.toml"
    sources.write_text('[[openapi]]\nname = "widgets"\ndocument = "widgets.json"\n')
    server = deployment.start(LOCKGATE_SOURCES_FILE=str(sources))
    [key] = server.printed_keys()

    async def scenario(mode: str) -> None:
        async with mcp_client(server.url, key, mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            description = tools["execute"].description or ""
            assert "There are 1009 tools, too many to list here" in description
            assert "- tools.widgets: 1000 tools" in description
            assert "- tools.notes: 4 tools" in description
            assert "- tools.lockgate: 5 tools" in description
            assert "create_widget_" not in description
            assert len(description) < 2000

            found = await client.call_tool("describe_tools", {"query": "widgets kind 417"})
            body = structured(found)
            assert [t["name"] for t in body["tools"]] == [
                "tools.widgets.create_widget_417",
                "tools.widgets.list_widgets_417",
            ]
            assert body["more"] == 0
            create = body["tools"][0]
            assert create["policy"] == "require_approval"
            assert create["signature"].startswith(
                "tools.widgets.create_widget_417(body: dict[str, Any]) -> Any"
            )
            assert create["parameters"]["components"] == {
                "schemas": {"Widget": large_document()["components"]["schemas"]["Widget"]}
            }
            # What a model reads of each tool: its summary, and the body's fields behind
            # `dict[str, Any]` (the required one marked), not only the signature.
            assert text_of(found).splitlines()[:3] == [
                create["signature"],
                "    Create a widget of kind 417 (POST /widgets417)",
                "    body fields: name: str (required)",
            ]

            everything = await client.call_tool("describe_tools", {})
            assert len(structured(everything)["tools"]) == 50
            assert structured(everything)["more"] == 959
            assert text_of(everything).endswith(
                "… and 959 more tools match: add words to the query to narrow it (they match "
                "a tool's name or description)."
            )

    for mode in MODES:
        run(scenario(mode))


def test_a_server_whose_sources_cannot_be_served_says_why_and_exits(
    deployment: Deployment, tmp_path: Path
) -> None:
    sources = tmp_path / "sources.toml"
    sources.write_text('[[openapi]]\nname = "widgets"\ndocument = """{"swagger": "2.0"}"""\n')
    server = deployment.spawn(name="unservable", LOCKGATE_SOURCES_FILE=str(sources))
    assert server.wait_exit(timeout=60) == 2, server.output()
    assert server.stderr().strip().splitlines()[-1] == (
        "cannot start: source 'widgets': not an OpenAPI 3.0 or 3.1 document (openapi: ''). "
        "Give the document's JSON or YAML (Swagger 2.0 must be converted first)."
    )
    assert "Lockgate MCP server:" not in server.stdout()
    # The first start was refused: it left no API key behind that nobody was shown.
    listed = deployment.cli("keys", "list")
    assert listed.returncode == 0 and "local" not in listed.stdout, listed.stdout
