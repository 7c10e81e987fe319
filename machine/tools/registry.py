"""Tools agent code can call, where they come from, and how their arguments are checked.

A `ToolSource` (the built-in notes, later OpenAPI or an upstream MCP server) contributes
`Tool`s; the `ToolRegistry` names them `source.name` and agent code calls them as
`tools.source.name(...)` with keyword arguments only. Arguments are validated against the
tool's JSON Schema before anything is journaled or paused for approval, so a person is
never asked to approve a call that could not run.

The parts, each in a module of its own (all of their public names are importable from here):
- `machine.tools.spec`: `ToolSpec`, `ToolContext`, the `Tool` and `ToolSource` protocols,
  `NAMESPACE` and `make_idempotency_key`;
- `machine.tools.errors`: `ToolFailed`, `ToolOutcomeUnknown`, `UnknownTool`, `InvalidArguments`,
  `InvalidToolSource`;
- `machine.tools.schema`: the JSON Schema subset and its check at registration;
- `machine.tools.arguments`: a call's arguments checked against that schema;
- `machine.tools.signatures`: parameters as Python text, for signatures and stubs;
- `machine.tools.stubs`: the `.pyi` text of the `tools` package;
- here, `ToolRegistry`: registration, look-up with suggestions, and the listings.
"""

from __future__ import annotations

import difflib
import threading

from pydantic import JsonValue

from lockgate.machine.tools.arguments import check_arguments, usage_hint

# Code imports these from here: the `X as X` form re-exports them (mypy --strict).
from lockgate.machine.tools.errors import InvalidArguments as InvalidArguments
from lockgate.machine.tools.errors import InvalidToolSource as InvalidToolSource
from lockgate.machine.tools.errors import ToolFailed as ToolFailed
from lockgate.machine.tools.errors import ToolOutcomeUnknown as ToolOutcomeUnknown
from lockgate.machine.tools.errors import UnknownTool as UnknownTool
from lockgate.machine.tools.spec import NAMESPACE as NAMESPACE
from lockgate.machine.tools.spec import Namespace as Namespace
from lockgate.machine.tools.spec import Tool as Tool
from lockgate.machine.tools.spec import ToolContext as ToolContext
from lockgate.machine.tools.spec import ToolSource as ToolSource
from lockgate.machine.tools.spec import ToolSpec as ToolSpec
from lockgate.machine.tools.spec import is_identifier, left_out_of
from lockgate.machine.tools.spec import make_idempotency_key as make_idempotency_key
from lockgate.machine.tools.stubs import module_stub, package_stub, package_text
from lockgate.machine.tools.tool_search import ToolIndex

_DEFAULT_DISCOVERY_HINT = "Search the available tools with the tool-discovery tool first."


class ToolRegistry:
    """Every tool agent code may call, by full name. Sources are read once, at `register`."""

    def __init__(self, *, discovery_hint: str = _DEFAULT_DISCOVERY_HINT) -> None:
        self._discovery_hint = discovery_hint
        self._sources: dict[str, dict[str, Tool]] = {}
        #: What each source left out of its document, in words (`left_out_of`).
        self._left_out: dict[str, tuple[str, ...]] = {}
        self._frozen: Namespace | None = None
        #: The full-text index `describe` ranks with, built on its first query.
        self._index: ToolIndex | None = None
        self._index_lock = threading.Lock()

    def register(self, source: ToolSource) -> None:
        name = source.name
        if not is_identifier(name) or name == NAMESPACE:
            raise InvalidToolSource(f"tool source name {name!r} is not usable in agent code")
        if name in self._sources:
            raise InvalidToolSource(
                f"a tool source named {name!r} is already registered",
                hint="Give each source a distinct name.",
            )
        tools: dict[str, Tool] = {}
        for tool in source.tools():
            spec = tool.spec
            if spec.source != name:
                raise InvalidToolSource(
                    f"tool {spec.full_name!r} claims source {spec.source!r} but came from {name!r}"
                )
            if spec.name in tools:
                raise InvalidToolSource(f"tool source {name!r} has two tools named {spec.name!r}")
            tools[spec.name] = tool
        self._sources[name] = tools
        self._left_out[name] = left_out_of(source)
        self._frozen = self._index = None

    def left_out(self, source: str | None = None) -> dict[str, tuple[str, ...]]:
        """What each source (or only `source`) could not serve, for those that left some out."""
        return {
            name: warnings
            for name, warnings in sorted(self._left_out.items())
            if warnings and source in (None, name)
        }

    def get(self, full_name: str) -> Tool:
        """The tool named `source.name`; `tools.source.name` (the call name) is accepted."""
        name = full_name.removeprefix(f"{NAMESPACE}.")
        source, _, tool_name = name.partition(".")
        tool = self._sources.get(source, {}).get(tool_name)
        if tool is None:
            raise UnknownTool(
                name=full_name,
                suggestions=[f"{NAMESPACE}.{n}" for n in self._close_matches(source, tool_name)],
                discovery_hint=self._discovery_hint,
            )
        return tool

    def _close_matches(self, source: str, tool_name: str) -> list[str]:
        if source in self._sources:
            # Compare tool names only: the shared `source.` prefix would make every tool of
            # the source look close. No close one: list them all, the source is right.
            names = sorted(self._sources[source])
            close = difflib.get_close_matches(tool_name, names, n=3, cutoff=0.6) or names
            return [f"{source}.{n}" for n in close]
        known = [spec.full_name for spec in self.specs()]
        return difflib.get_close_matches(f"{source}.{tool_name}", known, n=3, cutoff=0.75)

    def specs(self) -> list[ToolSpec]:
        specs = [tool.spec for tools in self._sources.values() for tool in tools.values()]
        return sorted(specs, key=lambda spec: spec.full_name)

    def describe(self, query: str = "") -> list[ToolSpec]:
        """The tools `query` finds, best first (`ToolIndex`); all of them for no query. A
        query naming a call (`tools.notes.w`) keeps the tools whose call name or
        description contains every word of it, as written."""
        words = query.lower().split()
        if words and not any("." in word for word in words):
            with self._index_lock:
                if self._index is None:
                    self._index = ToolIndex(self.specs())
                index = self._index
            found = index.search(query)
            if found is not None:
                return found
        return [
            spec
            for spec in self.specs()
            if all(w in f"{spec.call_name}\n{spec.description}".lower() for w in words)
        ]

    def namespace(self) -> dict[str, list[str]]:
        return {source: sorted(tools) for source, tools in sorted(self._sources.items())}

    def frozen_namespace(self) -> Namespace:
        """`namespace()` as the sandbox declares it (and keys its declarations by), kept."""
        if self._frozen is None:
            self._frozen = tuple((s, tuple(tools)) for s, tools in self.namespace().items())
        return self._frozen

    def stubs(self, source: str | None = None) -> str:
        """`.pyi` text for agent code's `tools` package.

        With `source`, the module `tools.<source>` (Monty: the `stubs` of that source's
        `ExternalModule`). Without, the whole package as one text for documentation: the
        `__init__.pyi` from `package_stub()`, then each source's module.
        """
        if source is not None:
            if source not in self._sources:
                raise UnknownTool(name=source, suggestions=(), discovery_hint=self._discovery_hint)
            return module_stub(source, self._source_specs(source))
        return package_text({name: self._source_specs(name) for name in self._sources})

    def package_stub(self) -> str:
        """The `tools` package's own `.pyi` (see `machine.tools.stubs.package_stub`)."""
        return package_stub(self._sources)

    def _source_specs(self, source: str) -> list[ToolSpec]:
        return [tool.spec for tool in self._sources[source].values()]

    def validate_arguments(
        self, full_name: str, kwargs: dict[str, JsonValue], args: list[JsonValue]
    ) -> dict[str, JsonValue]:
        """Checked (and JSON-normalised: tuples become lists) keyword arguments for a call.

        Raises UnknownTool or InvalidArguments, naming the tool, the argument and the problem.
        A tool with a `problems(arguments)` method (a GraphQL document checked against its
        schema) is asked too, after its JSON Schema, so its refusals also come before any pause.
        """
        tool = self.get(full_name)
        checked = check_arguments(tool.spec, kwargs, args)
        more = getattr(tool, "problems", None)
        found: list[str] = more(checked) if callable(more) else []
        if found:
            raise InvalidArguments(
                tool=tool.spec.full_name,
                problems=found,
                usage=usage_hint(tool.spec),
            )
        return checked
