"""The tool sources the tool-registry tests register: `DocsSource` (a minimal third-party
source, its `search` tool taking every kind of parameter in `SEARCH_SCHEMA`) with its
`EchoTool`s, `spec` to build a ToolSpec with only what a test cares about, and the
`registry` fixture (the notes and docs sources registered).

A pytest plugin: test modules load the fixture with
`pytest_plugins = ["tests.support.tool_sources"]`, and import the helpers from here before
pytest registers the plugin, hence PYTEST_DONT_REWRITE (as in `tests.support.servers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import (
    NotesSource,
    Tool,
    ToolContext,
    ToolFailed,
    ToolRegistry,
    ToolSpec,
)

SEARCH_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "default": 10},
        "ratio": {"type": "number"},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "filter": {
            "type": "object",
            "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
            "additionalProperties": False,
        },
        "order": {"type": "string", "enum": ["asc", "desc"]},
        "cursor": {"type": ["string", "null"]},
        "extra": {},
    },
    "required": ["query"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class EchoTool:
    spec: ToolSpec

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        if arguments.get("query") == "fail":
            raise ToolFailed("asked to fail")
        return {"arguments": arguments, "key": context.idempotency_key}


@dataclass(frozen=True)
class DocsSource:
    """A minimal third-party source: what OpenAPI or MCP sources will look like."""

    name: str = "docs"

    def tools(self) -> Sequence[Tool]:
        return [
            EchoTool(
                ToolSpec(
                    source=self.name,
                    name="search",
                    description="Search the Documentation by keyword.",
                    parameters=SEARCH_SCHEMA,
                    returns="list[dict]",
                    idempotent=True,
                    default_policy=PolicyDecision.APPROVE,
                )
            ),
            EchoTool(ToolSpec(source=self.name, name="purge", description="Remove everything.")),
        ]


@pytest.fixture(name="registry")
def registry_fixture() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(NotesSource())
    registry.register(DocsSource())
    return registry


def spec(**overrides: Any) -> ToolSpec:
    fields: dict[str, Any] = {"source": "s", "name": "t", "description": "d"}
    return ToolSpec(**(fields | overrides))
