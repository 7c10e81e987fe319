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

from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed
from lockgate.machine.tools.kinds import STORED_KINDS
from lockgate.machine.tools.source_kind import ADMIN_SOURCE, NAME_ARGUMENT, admin_tool, arguments
from lockgate.machine.tools.source_tables import REQUEST
from lockgate.machine.tools.spec import Tool, ToolContext, ToolSpec

if TYPE_CHECKING:  # the catalog is given at start-up (it needs the book this source is in)
    from lockgate.machine.source_catalog import SourceCatalog


SOURCE = ADMIN_SOURCE

LIST = admin_tool(
    "list_sources",
    "The sources your code can call: each {name, kind, scope, tools}; scope is configured "
    "(the server's), global (stored for everyone) or own (yours, which you may remove). A "
    "source whose document has operations it cannot serve also has left_out: each one "
    "named, with why.",
    arguments([]),
    read=True,
)
REMOVE = admin_tool(
    "remove_source",
    "Remove one of your own sources: its tools are gone for later calls. Returns "
    "{name, kind, scope, tools}.",
    arguments(["name"], name=NAME_ARGUMENT),
    read=False,
)

#: Agent code's tools that add a source, one per kind it may add, and the kind each adds.
ADDERS = tuple((kind.add_tool, kind.name) for kind in STORED_KINDS if kind.add_tool is not None)


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
            _AdminTool(spec, self._adder(kind), self._checker(kind)) for spec, kind in ADDERS
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
