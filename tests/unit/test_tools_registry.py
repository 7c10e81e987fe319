"""The tool registry: ToolSpec (careful defaults, signatures, what it refuses), registering
sources and looking tools up (with suggestions for unknown names), discovery (describe, the
namespace, type stubs), and the context a tool is called with.

Argument validation is tests/unit/test_tools_arguments.py."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from lockgate.machine.errors import ErrorCode
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import (
    InvalidToolSource,
    NotesSource,
    Tool,
    ToolContext,
    ToolFailed,
    ToolRegistry,
    ToolSource,
    UnknownTool,
    make_idempotency_key,
)
from tests.support.tool_sources import DocsSource, EchoTool, spec

pytest_plugins = ["tests.support.tool_sources"]


# -- ToolSpec ------------------------------------------------------------------------------


def test_spec_defaults_are_the_careful_ones() -> None:
    plain = spec()
    assert plain.full_name == "s.t"
    assert plain.call_name == "tools.s.t"
    assert plain.default_policy is PolicyDecision.REQUIRE_APPROVAL
    assert plain.idempotent is False
    assert plain.secrets == ()
    assert plain.signature() == "tools.s.t() -> Any  # requires approval"
    assert plain.usage() == "tools.s.t()"
    # No parameters declared: none accepted.
    assert plain.parameters == {"type": "object", "properties": {}, "additionalProperties": False}


def test_signatures(registry: ToolRegistry) -> None:
    write = registry.get("notes.write").spec
    assert (
        write.signature() == "tools.notes.write(key: str, text: str) -> dict  # requires approval"
    )
    assert (
        write.signature(PolicyDecision.APPROVE) == "tools.notes.write(key: str, text: str) -> dict"
    )
    assert write.signature(PolicyDecision.BLOCK).endswith("# blocked by policy")
    assert (
        registry.get("notes.list").spec.signature()
        == "tools.notes.list() -> list[str]  # read-only"
    )
    search = registry.get("docs.search").spec
    assert search.signature() == (
        "tools.docs.search(query: str, limit: int = 10, ratio: float = ..., exact: bool = ..., "
        "tags: list[str] = ..., filter: dict[str, Any] = ..., order: str = ..., "
        "cursor: str | None = ..., extra: Any = ...) -> list[dict]  # read-only"
    )
    assert write.usage() == "tools.notes.write(key=..., text=...)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "no-dash"}, "not a Python identifier"),
        ({"name": "import"}, "not a Python identifier"),
        ({"parameters": {"type": "array"}}, "must have type 'object'"),
        (
            {"parameters": {"type": "object", "properties": {"a": {"type": "date"}}}},
            "parameters at properties/a/type is not a valid JSON Schema: 'date' is not a "
            "JSON type (array, boolean, integer, null, number, object, string)",
        ),
        ({"parameters": {"type": "object", "properties": {"a-b": {}}}}, "keyword argument"),
        (
            {"parameters": {"type": "object", "properties": []}},
            "parameters at properties is not a valid JSON Schema: [] is not of type 'object'",
        ),
        (
            {"parameters": {"type": "object", "required": "a"}},
            "parameters at required is not a valid JSON Schema: 'a' is not of type 'array'",
        ),
        ({"parameters": {"type": "object", "additionalProperties": 1}}, "additionalProperties"),
        ({"parameters": {"type": "object", "properties": {"a": {"items": []}}}}, "items"),
        ({"parameters": {"type": "object", "properties": {"a": {"enum": 1}}}}, "enum"),
        ({"parameters": {"type": "object", "properties": {"a": {"type": []}}}}, "non-empty"),
        (
            {"parameters": {"type": "object", "properties": {"a": {"pattern": "("}}}},
            "parameters at properties/a/pattern is not a valid JSON Schema: '(' is not an "
            "ECMA-262 regular expression: unbalanced parenthesis",
        ),
        ({"returns": "dict["}, "not a Python type expression"),
    ],
)
def test_spec_refuses_what_cannot_be_served(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        spec(**overrides)


def test_spec_is_frozen() -> None:
    frozen = spec()
    with pytest.raises(ValidationError):
        frozen.name = "other"


# -- registration and lookup ---------------------------------------------------------------


def test_sources_satisfy_the_protocol() -> None:
    sources: list[ToolSource] = [NotesSource(), DocsSource()]
    assert [s.name for s in sources] == ["notes", "docs"]


def test_duplicate_source_is_refused(registry: ToolRegistry) -> None:
    with pytest.raises(InvalidToolSource) as refused:
        registry.register(NotesSource())
    assert "a tool source named 'notes' is already registered" in refused.value.message
    assert refused.value.hint == "Give each source a distinct name."


@pytest.mark.parametrize("name", ["tools", "not-valid", "class"])
def test_unusable_source_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidToolSource, match="not usable"):
        ToolRegistry().register(DocsSource(name=name))


def test_tool_must_belong_to_its_source() -> None:
    @dataclass(frozen=True)
    class Liar:
        name: str = "liar"

        def tools(self) -> Sequence[Tool]:
            return [EchoTool(spec(source="other"))]

    with pytest.raises(InvalidToolSource, match="claims source 'other'"):
        ToolRegistry().register(Liar())


def test_duplicate_tool_names_are_refused() -> None:
    @dataclass(frozen=True)
    class Twice:
        name: str = "s"

        def tools(self) -> Sequence[Tool]:
            return [EchoTool(spec()), EchoTool(spec())]

    with pytest.raises(InvalidToolSource, match="two tools named 't'"):
        ToolRegistry().register(Twice())


def test_get_accepts_full_and_call_names(registry: ToolRegistry) -> None:
    assert registry.get("notes.write").spec.full_name == "notes.write"
    assert registry.get("tools.notes.write") is registry.get("notes.write")


def test_unknown_tool_suggests_close_matches(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool) as caught:
        registry.get("tools.notes.wirte")
    error = caught.value
    assert error.code is ErrorCode.UNKNOWN_TOOL
    assert error.message == "there is no tool 'tools.notes.wirte'"
    assert error.suggestions == ("tools.notes.write",)
    assert error.hint is not None
    assert "Did you mean tools.notes.write?" in error.hint
    assert "tool-discovery" in error.hint


def test_unknown_tool_in_a_known_source_lists_its_tools(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool) as caught:
        registry.get("notes.frobnicate")
    assert caught.value.suggestions == (
        "tools.notes.delete",
        "tools.notes.list",
        "tools.notes.read",
        "tools.notes.write",
    )


def test_unknown_source_suggests_close_full_names(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool) as caught:
        registry.get("note.write")
    assert caught.value.suggestions == ("tools.notes.write",)


@dataclass(frozen=True)
class ManySends:
    name: str = "mail"

    def tools(self) -> Sequence[Tool]:
        return [EchoTool(spec(source=self.name, name=f"send{n}")) for n in range(1, 6)]


def test_suggestions_are_the_three_closest_at_most() -> None:
    registry = ToolRegistry()
    registry.register(ManySends())
    with pytest.raises(UnknownTool) as in_source:
        registry.get("mail.send")
    suggested = in_source.value.suggestions
    assert len(suggested) == 3 and all(s.startswith("tools.mail.send") for s in suggested)
    with pytest.raises(UnknownTool) as other_source:
        registry.get("mails.send4")
    assert len(other_source.value.suggestions) == 3
    assert other_source.value.suggestions[0] == "tools.mail.send4"


def test_unknown_tool_without_any_match() -> None:
    registry = ToolRegistry(discovery_hint="Call search_tools first.")
    with pytest.raises(UnknownTool) as caught:
        registry.get("zzz")
    assert caught.value.suggestions == ()
    assert caught.value.hint == "Call search_tools first."


# -- discovery -----------------------------------------------------------------------------


def test_specs_are_sorted(registry: ToolRegistry) -> None:
    assert [s.full_name for s in registry.specs()] == [
        "docs.purge",
        "docs.search",
        "notes.delete",
        "notes.list",
        "notes.read",
        "notes.write",
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", 6),
        ("  ", 6),
        ("NOTES", 4),
        ("tools.notes.w", 1),
        ("documentation", 1),  # in the description only
        ("note key delete", 1),  # every word, anywhere
        ("nothing-like-this", 0),
    ],
)
def test_describe(registry: ToolRegistry, query: str, expected: int) -> None:
    assert len(registry.describe(query)) == expected


def test_namespace(registry: ToolRegistry) -> None:
    assert registry.namespace() == {
        "docs": ["purge", "search"],
        "notes": ["delete", "list", "read", "write"],
    }


def test_module_stub(registry: ToolRegistry) -> None:
    stub = registry.stubs("notes")
    ast.parse(stub)
    assert "def write(*, key: str, text: str) -> dict: ..." in stub
    # `list` is a tool here, so annotations must reach the builtin explicitly.
    assert "import builtins" in stub
    assert "def list() -> builtins.list[str]: ..." in stub
    assert "# requires approval" in stub


def test_stub_with_optional_and_nested_parameters(registry: ToolRegistry) -> None:
    stub = registry.stubs("docs")
    ast.parse(stub)
    assert "import builtins" not in stub
    assert "def search(*, query: str, limit: int = ..., " in stub
    assert "tags: list[str] = ..., filter: dict[str, Any] = ..." in stub
    assert "def purge() -> Any: ..." in stub


def test_package_stub_and_documentation(registry: ToolRegistry) -> None:
    package = registry.package_stub()
    ast.parse(package)
    assert "from . import docs as docs\nfrom . import notes as notes" in package
    text = registry.stubs()
    assert text.index("tools/__init__.pyi") < text.index("tools/docs.pyi")
    assert text.index("tools/docs.pyi") < text.index("tools/notes.pyi")


def test_stub_of_unknown_source(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool):
        registry.stubs("nope")


@pytest.mark.slow
def test_stubs_type_check_agent_code_in_monty(registry: ToolRegistry) -> None:
    import pydantic_monty as monty

    def noop(**kwargs: object) -> None:
        return None

    modules = {
        "tools": monty.ExternalModule(
            {
                name: monty.ExternalModule(
                    {tool: noop for tool in tools}, stubs=registry.stubs(name)
                )
                for name, tools in registry.namespace().items()
            },
            stubs=registry.package_stub(),
        )
    }

    def first_tool_call(code: str) -> str:
        """Run `code` up to its first tool call; the type check runs on the way there."""
        with monty.Monty() as pool, pool.checkout(type_check=True, external_modules=modules) as s:
            snapshot: Any = s.feed_start(code)
            while not snapshot.function_name.startswith("tools."):
                snapshot = snapshot.resume_auto()  # the import arrives as a host call too
            return str(snapshot.function_name)

    good = "import tools\nx: list[str] = tools.notes.list()\ntools.notes.write(key='a', text='b')"
    assert first_tool_call(good) == "tools.notes.list"
    for bad in ("tools.notes.write('a', 'b')", "tools.notes.write(key=1, text='b')"):
        with pytest.raises(monty.MontyTypingError):
            first_tool_call("import tools\n" + bad)


# -- context and calls ---------------------------------------------------------------------


def test_context_hides_and_freezes_secrets() -> None:
    source = {"notes_token": "very-secret-value"}
    context = ToolContext(
        idempotency_key=make_idempotency_key("ex1", 3), secrets=source, principal_id="alice"
    )
    assert context.idempotency_key == "ex1:3"
    assert "very-secret-value" not in repr(context)
    source["notes_token"] = "changed"
    assert context.secrets["notes_token"] == "very-secret-value"
    with pytest.raises(TypeError):
        context.secrets["x"] = "y"  # type: ignore[index]


def test_calling_a_registered_tool(registry: ToolRegistry) -> None:
    context = ToolContext(idempotency_key="e:1", secrets={}, principal_id="p")
    tool = registry.get("docs.search")
    arguments = registry.validate_arguments("docs.search", {"query": "x"}, [])
    assert tool.call(arguments, context) == {"arguments": {"query": "x"}, "key": "e:1"}
    with pytest.raises(ToolFailed, match="asked to fail") as caught:
        tool.call({"query": "fail"}, context)
    assert caught.value.message == "asked to fail"
