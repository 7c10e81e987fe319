"""`tools.lockgate.*`: agent code adds, lists and removes its principal's own tool sources.

Adding and removing change what the principal's code can do next, so by default each call
waits for a person's approval like any write; listing is a read. The sources are stored
(`machine/source_catalog.py`), so an approved add that was paused across a restart is made
by whichever instance resumes it, and every instance then serves the new tools.

A request may name neither a file on the server nor a command to run there: documents come
as text or from an http(s) URL, upstream MCP servers by URL (see `source_file.Origin`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed
from lockgate.machine.tools.source_tables import AUTH_FORMS, REQUEST
from lockgate.machine.tools.spec import Tool, ToolContext, ToolSpec

if TYPE_CHECKING:  # the catalog is given at start-up (it needs the book this source is in)
    from lockgate.machine.source_catalog import SourceCatalog


SOURCE = "lockgate"

_NAME: dict[str, JsonValue] = {
    "type": "string",
    "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
    "maxLength": 64,
    "description": "The source's name: its tools are then tools.<name>.<tool>(...).",
}
_AUTH: dict[str, JsonValue] = {
    "type": "object",
    "description": "Optional: which stored secret the calls carry, and how. One of "
    + AUTH_FORMS.replace(" = ", ": "),
}


def _schema(required: list[str], **properties: JsonValue) -> dict[str, JsonValue]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def _spec(name: str, description: str, parameters: dict[str, JsonValue], *, read: bool) -> ToolSpec:
    return ToolSpec(
        source=SOURCE,
        name=name,
        description=description,
        parameters=parameters,
        returns="dict" if not name.startswith("list") else "list[dict]",
        idempotent=read,
        default_policy=PolicyDecision.APPROVE if read else PolicyDecision.REQUIRE_APPROVAL,
    )


ADD_OPENAPI = _spec(
    "add_openapi_source",
    "Add an OpenAPI 3.0/3.1 API as a source of tools for your code: each operation becomes "
    "tools.<name>.<operationId>(...). document: the document's JSON or YAML text, or its "
    "http(s) URL. Returns {name, kind, scope, tools}.",
    _schema(
        ["name", "document"],
        name=_NAME,
        document={"type": "string", "minLength": 1, "description": "The text, or its URL."},
        base_url={
            "type": "string",
            "pattern": "^https?://",
            "description": "Optional: where calls go, instead of the document's first server.",
        },
        auth=_AUTH,
    ),
    read=False,
)
ADD_GRAPHQL = _spec(
    "add_graphql_source",
    "Add a GraphQL endpoint as a source: tools.<name>.query(query=..., variables=...) and "
    "tools.<name>.mutate(...). schema: optional SDL text; without it the endpoint is "
    "introspected. Returns {name, kind, scope, tools}.",
    _schema(
        ["name", "endpoint"],
        name=_NAME,
        endpoint={"type": "string", "pattern": "^https?://"},
        schema={"type": "string", "minLength": 1, "description": "Optional SDL text."},
        auth=_AUTH,
    ),
    read=False,
)
ADD_MCP = _spec(
    "add_mcp_source",
    "Add an upstream MCP server (streamable HTTP) as a source: its tools become "
    "tools.<name>.<tool>(...). Returns {name, kind, scope, tools}.",
    _schema(["name", "url"], name=_NAME, url={"type": "string", "pattern": "^https?://"}),
    read=False,
)
LIST = _spec(
    "list_sources",
    "The sources your code can call: each {name, kind, scope, tools}; scope is configured "
    "(the server's), global (stored for everyone) or own (yours, which you may remove).",
    _schema([]),
    read=True,
)
REMOVE = _spec(
    "remove_source",
    "Remove one of your own sources: its tools are gone for later calls. Returns "
    "{name, kind, scope, tools}.",
    _schema(["name"], name=_NAME),
    read=False,
)

_ADDED_KIND = {ADD_OPENAPI.name: "openapi", ADD_GRAPHQL.name: "graphql", ADD_MCP.name: "mcp"}


@dataclass(frozen=True)
class _AdminTool:
    spec: ToolSpec
    run: Callable[[dict[str, Any], str], JsonValue]
    #: The registry asks it before the call is journaled or waits for a person.
    check: Callable[[dict[str, Any]], list[str]] = lambda arguments: []

    def problems(self, arguments: dict[str, JsonValue]) -> list[str]:
        return self.check(dict(arguments))

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        try:
            return self.run(dict(arguments), context.principal_id)
        except InvalidToolSource as exc:
            raise ToolFailed(f"{exc.message}. {exc.hint}" if exc.hint else exc.message) from None


class AdminSource:
    """The `lockgate` tools, working on `catalog` for the calling principal."""

    name = SOURCE

    def __init__(self) -> None:
        self._bound: SourceCatalog | None = None

    def bind(self, catalog: SourceCatalog) -> None:
        """Work on `catalog` (made after the registries this source is part of)."""
        self._bound = catalog

    @property
    def _catalog(self) -> SourceCatalog:
        if self._bound is None:
            raise ToolFailed("the server is still starting; try again in a moment")
        return self._bound

    def tools(self) -> Sequence[Tool]:
        made: list[Tool] = [
            _AdminTool(spec, self._adder(kind), self._checker(kind))
            for spec in (ADD_OPENAPI, ADD_GRAPHQL, ADD_MCP)
            for kind in [_ADDED_KIND[spec.name]]
        ]
        made += [_AdminTool(LIST, self._list), _AdminTool(REMOVE, self._remove)]
        return made

    def _adder(self, kind: str) -> Callable[[dict[str, Any], str], JsonValue]:
        def add(arguments: dict[str, Any], principal: str) -> JsonValue:
            added = self._catalog.add(kind, arguments, principal=principal, origin=REQUEST)
            return added.as_json()

        return add

    def _checker(self, kind: str) -> Callable[[dict[str, Any]], list[str]]:
        return lambda arguments: self._catalog.precheck(kind, arguments)

    def _list(self, arguments: dict[str, Any], principal: str) -> JsonValue:
        return [found.as_json() for found in self._catalog.listed(principal)]

    def _remove(self, arguments: dict[str, Any], principal: str) -> JsonValue:
        return self._catalog.remove(str(arguments["name"]), principal=principal).as_json()
