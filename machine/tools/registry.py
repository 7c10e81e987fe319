"""Tools agent code can call, where they come from, and how their arguments are checked.

A `ToolSource` (the built-in notes, later OpenAPI or an upstream MCP server) contributes
`Tool`s; the `ToolRegistry` names them `source.name` and agent code calls them as
`tools.source.name(...)` with keyword arguments only. Arguments are validated against the
tool's JSON Schema before anything is journaled or paused for approval, so a person is
never asked to approve a call that could not run.
"""

from __future__ import annotations

import difflib
import keyword
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from machine.errors import ErrorCode, LockgateError
from machine.policy import PolicyDecision

NAMESPACE = "tools"
"""The module agent code imports; a tool's call name is `tools.<source>.<name>`."""

_PY_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}
_BUILTIN_ANNOTATIONS = ("str", "int", "float", "bool", "list", "dict")
_DEFAULT_DISCOVERY_HINT = "Search the available tools with the tool-discovery tool first."


def make_idempotency_key(execution_id: str, sequence: int) -> str:
    """The key every call carries: stable across retries of the same call, unique otherwise."""
    return f"{execution_id}:{sequence}"


def _is_identifier(name: str) -> bool:
    # Source and tool names become attribute names in agent code.
    return name.isidentifier() and not keyword.iskeyword(name)


# -- errors ---------------------------------------------------------------------------------


class ToolFailed(Exception):
    """An expected failure of the tool itself (a missing note, a rejected request).

    Not a LockgateError: it belongs to the agent code, which sees it raised at the call and
    may catch it. Messages must not contain secrets; the engine still redacts them.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownTool(LockgateError):
    code = ErrorCode.UNKNOWN_TOOL

    def __init__(self, *, name: str, suggestions: Sequence[str], discovery_hint: str) -> None:
        self.name, self.suggestions = name, tuple(suggestions)
        guess = f"Did you mean {', '.join(self.suggestions)}? " if self.suggestions else ""
        super().__init__(f"there is no tool {name!r}", hint=guess + discovery_hint)


class InvalidArguments(LockgateError):
    code = ErrorCode.INVALID_ARGUMENTS

    def __init__(self, *, tool: str, problems: Sequence[str], usage: str) -> None:
        self.tool, self.problems = tool, tuple(problems)
        super().__init__(f"{NAMESPACE}.{tool}: {'; '.join(self.problems)}", hint=usage)


class InvalidToolSource(LockgateError):
    """A source or tool definition Lockgate cannot serve (a programming error at start-up)."""

    code = ErrorCode.INVALID_INPUT


# -- the tool interface ---------------------------------------------------------------------


def _empty_object_schema() -> dict[str, JsonValue]:
    return {"type": "object", "properties": {}, "additionalProperties": False}


class ToolSpec(BaseModel):
    """What a tool is: its name, its arguments' schema, and how careful to be with it."""

    model_config = ConfigDict(frozen=True)

    source: str
    name: str
    description: str
    parameters: dict[str, JsonValue] = Field(default_factory=_empty_object_schema)
    returns: str = "Any"
    """A Python type expression, for signatures and stubs: `dict`, `list[str]`."""
    idempotent: bool = False
    """Safe to call twice (read-only): an in-doubt call is retried only when this is true."""
    default_policy: PolicyDecision = PolicyDecision.REQUIRE_APPROVAL
    secrets: tuple[str, ...] = ()

    @field_validator("source", "name")
    @classmethod
    def _check_identifier(cls, value: str) -> str:
        if not _is_identifier(value):
            raise ValueError(f"{value!r} is not a Python identifier (agent code calls it)")
        return value

    @field_validator("parameters")
    @classmethod
    def _check_parameters(cls, schema: dict[str, JsonValue]) -> dict[str, JsonValue]:
        if schema.get("type") != "object":
            raise ValueError("the parameters schema must have type 'object'")
        _check_schema(schema, "parameters")
        for name in _properties(schema):
            if not _is_identifier(name):
                raise ValueError(f"argument {name!r} cannot be passed as a keyword argument")
        return schema

    @field_validator("returns")
    @classmethod
    def _check_returns(cls, value: str) -> str:
        try:
            compile(value, "<returns>", "eval")
        except SyntaxError:
            raise ValueError(f"returns {value!r} is not a Python type expression") from None
        return value

    @property
    def full_name(self) -> str:
        return f"{self.source}.{self.name}"

    @property
    def call_name(self) -> str:
        return f"{NAMESPACE}.{self.full_name}"

    def _ordered_parameters(self) -> list[tuple[str, Mapping[str, JsonValue], bool]]:
        """(name, schema, required), required ones first: the order a person reads them in."""
        required = _required(self.parameters)
        params = [(n, s, n in required) for n, s in _properties(self.parameters).items()]
        return sorted(params, key=lambda p: not p[2])

    def signature(self, decision: PolicyDecision | None = None) -> str:
        """`tools.notes.write(key: str, text: str) -> dict  # requires approval`.

        `decision` is the effective policy when known; the tool's default otherwise.
        """
        notes = _notes(decision or self.default_policy, self.idempotent)
        return self._bare_signature() + (f"  # {notes}" if notes else "")

    def _bare_signature(self) -> str:
        params = ", ".join(
            _parameter(name, schema, required, ())
            for name, schema, required in self._ordered_parameters()
        )
        return f"{self.call_name}({params}) -> {self.returns}"

    def usage(self) -> str:
        """`tools.notes.write(key=..., text=...)`: how a keyword-only call looks."""
        names = ", ".join(f"{name}=..." for name, _, _ in self._ordered_parameters())
        return f"{self.call_name}({names})"

    def stub(self, shadowed: Sequence[str] = ()) -> str:
        """This tool as a keyword-only `def` for a `.pyi` module; `shadowed` lists builtin
        names that the module's own functions hide (see `ToolRegistry.stubs`)."""
        params = ", ".join(
            _parameter(name, schema, required, shadowed, stub=True)
            for name, schema, required in self._ordered_parameters()
        )
        lines = [f"# {line}" for line in self.description.splitlines() if line.strip()]
        notes = _notes(self.default_policy, False)
        if notes:
            lines.append(f"# {notes} (by default; the server's policy decides)")
        if self.idempotent:
            lines.append("# read-only")
        star = "*, " if params else ""
        returns = _qualify(self.returns, shadowed)
        lines.append(f"def {self.name}({star}{params}) -> {returns}: ...")
        return "\n".join(lines)


@dataclass(frozen=True)
class ToolContext:
    """What a call gets besides its arguments. Never stored: it holds resolved secrets."""

    idempotency_key: str
    secrets: Mapping[str, str] = field(repr=False)
    principal_id: str

    def __post_init__(self) -> None:
        # A read-only copy: a tool must not be able to change what the next call sees.
        object.__setattr__(self, "secrets", MappingProxyType(dict(self.secrets)))


class Tool(Protocol):
    @property
    def spec(self) -> ToolSpec: ...

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        """Run once with validated arguments; raise ToolFailed for an expected failure."""
        ...


class ToolSource(Protocol):
    @property
    def name(self) -> str: ...

    def tools(self) -> Sequence[Tool]: ...


# -- the registry ---------------------------------------------------------------------------


class ToolRegistry:
    """Every tool agent code may call, by full name. Sources are read once, at `register`."""

    def __init__(self, *, discovery_hint: str = _DEFAULT_DISCOVERY_HINT) -> None:
        self._discovery_hint = discovery_hint
        self._sources: dict[str, dict[str, Tool]] = {}

    def register(self, source: ToolSource) -> None:
        name = source.name
        if not _is_identifier(name) or name == NAMESPACE:
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
        """Tools whose call name or description contains every word of `query`."""
        words = query.lower().split()
        return [
            spec
            for spec in self.specs()
            if all(w in f"{spec.call_name}\n{spec.description}".lower() for w in words)
        ]

    def namespace(self) -> dict[str, list[str]]:
        return {source: sorted(tools) for source, tools in sorted(self._sources.items())}

    def stubs(self, source: str | None = None) -> str:
        """`.pyi` text for agent code's `tools` package.

        With `source`, the module `tools.<source>` (Monty: the `stubs` of that source's
        `ExternalModule`). Without, the whole package as one text for documentation: the
        `__init__.pyi` from `package_stub()`, then each source's module.
        """
        if source is not None:
            if source not in self._sources:
                raise UnknownTool(name=source, suggestions=(), discovery_hint=self._discovery_hint)
            return self._module_stub(source)
        parts = [f"# ---- {NAMESPACE}/__init__.pyi ----\n{self.package_stub()}"]
        parts += [
            f"# ---- {NAMESPACE}/{name}.pyi ----\n{self._module_stub(name)}"
            for name in sorted(self._sources)
        ]
        return "\n".join(parts)

    def package_stub(self) -> str:
        """The `tools` package's own `.pyi` (Monty: the `stubs` of the outer `ExternalModule`).

        Re-exporting each source lets `import tools` then `tools.notes.write(...)` type-check;
        without it the checker asks for `import tools.notes`.
        """
        lines = [f'"""Tools: call as {NAMESPACE}.<source>.<name>(keyword=...)."""', ""]
        lines += [f"from . import {name} as {name}" for name in sorted(self._sources)]
        return "\n".join(lines) + "\n"

    def _module_stub(self, source: str) -> str:
        specs = sorted((t.spec for t in self._sources[source].values()), key=lambda s: s.name)
        # A tool named like a builtin (notes.list) hides it for the module's annotations.
        shadowed = tuple(n for n in _BUILTIN_ANNOTATIONS if any(s.name == n for s in specs))
        header = f'"""{NAMESPACE}.{source}: call with keyword arguments only."""\n\n'
        if shadowed:
            header += "import builtins\n"
        header += "from typing import Any\n\n"
        return header + "\n\n".join(spec.stub(shadowed) for spec in specs) + "\n"

    def validate_arguments(
        self, full_name: str, kwargs: dict[str, JsonValue], args: list[JsonValue]
    ) -> dict[str, JsonValue]:
        """Checked (and JSON-normalised: tuples become lists) keyword arguments for a call.

        Raises UnknownTool or InvalidArguments, naming the tool, the argument and the problem.
        """
        spec = self.get(full_name).spec
        if args:
            raise InvalidArguments(
                tool=spec.full_name,
                problems=[
                    f"got {len(args)} positional argument(s); call tools with keyword "
                    f"arguments: {spec.usage()}"
                ],
                usage=_usage_hint(spec),
            )
        problems: list[str] = []
        checked = _check_value(kwargs, spec.parameters, "", problems)
        if problems or not isinstance(checked, dict):
            raise InvalidArguments(tool=spec.full_name, problems=problems, usage=_usage_hint(spec))
        return checked


# -- signatures -----------------------------------------------------------------------------


def _usage_hint(spec: ToolSpec) -> str:
    return f"Call it as {spec._bare_signature()}, with keyword arguments."


def _notes(decision: PolicyDecision, idempotent: bool) -> str:
    parts = {
        PolicyDecision.APPROVE: [],
        PolicyDecision.REQUIRE_APPROVAL: ["requires approval"],
        PolicyDecision.BLOCK: ["blocked by policy"],
    }[decision]
    if idempotent:
        parts = [*parts, "read-only"]
    return "; ".join(parts)


def _annotation(schema: Mapping[str, JsonValue], shadowed: Sequence[str]) -> str:
    types = _types(schema)
    if not types:
        return "Any"
    rendered: list[str] = []
    for t in types:
        py = _PY_TYPES[t]
        items = schema.get("items")
        if t == "array" and isinstance(items, dict):
            py = f"list[{_annotation(items, shadowed)}]"
        elif t == "object":
            py = "dict[str, Any]"
        rendered.append(_qualify(py, shadowed))
    return " | ".join(rendered)


def _qualify(annotation: str, shadowed: Sequence[str]) -> str:
    for name in shadowed:
        annotation = re.sub(rf"(?<![\w.]){name}\b", f"builtins.{name}", annotation)
    return annotation


def _parameter(
    name: str,
    schema: Mapping[str, JsonValue],
    required: bool,
    shadowed: Sequence[str],
    *,
    stub: bool = False,
) -> str:
    text = f"{name}: {_annotation(schema, shadowed)}"
    if required:
        return text
    if stub or "default" not in schema:
        return f"{text} = ..."
    return f"{text} = {schema['default']!r}"


# -- a small JSON Schema subset -------------------------------------------------------------
# Supported: type (one or a list), properties, required, additionalProperties (boolean),
# items, enum. Other keywords (description, default, format, ...) are accepted and ignored:
# the tool itself still refuses what it cannot use.


def _types(schema: Mapping[str, JsonValue]) -> list[str]:
    declared = schema.get("type")
    if declared is None:
        return []
    if isinstance(declared, str):
        return [declared]
    return [str(t) for t in declared] if isinstance(declared, list) else []


def _properties(schema: Mapping[str, JsonValue]) -> dict[str, Mapping[str, JsonValue]]:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    return {name: s for name, s in props.items() if isinstance(s, dict)}


def _required(schema: Mapping[str, JsonValue]) -> list[str]:
    required = schema.get("required")
    return [str(n) for n in required] if isinstance(required, list) else []


def _check_schema(schema: Mapping[str, JsonValue], where: str) -> None:
    """Refuse, at registration, schemas the validator would misread at call time."""
    declared = schema.get("type")
    if declared is not None and not (
        isinstance(declared, str) or (isinstance(declared, list) and declared)
    ):
        raise ValueError(f"{where}: 'type' must be a string or a non-empty list")
    for t in _types(schema):
        if t not in _PY_TYPES:
            raise ValueError(f"{where}: unsupported type {t!r}")
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(s, dict) for s in props.values()):
        raise ValueError(f"{where}: 'properties' must map names to schemas")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
        raise ValueError(f"{where}: 'required' must be a list of names")
    if not isinstance(schema.get("additionalProperties", True), bool):
        raise ValueError(f"{where}: only boolean 'additionalProperties' is supported")
    items = schema.get("items", {})
    if not isinstance(items, dict):
        raise ValueError(f"{where}: 'items' must be one schema")
    if not isinstance(schema.get("enum", []), list):
        raise ValueError(f"{where}: 'enum' must be a list")
    for name, sub in _properties(schema).items():
        _check_schema(sub, f"{where}.{name}")
    if items:
        _check_schema(items, f"{where}[]")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _matches_type(value: object, t: str) -> bool:
    actual = _json_type(value)
    return actual == t or (t == "number" and actual == "integer")


def _label(path: str) -> str:
    return f"argument {path!r}" if path else "the arguments"


def _check_value(
    value: object, schema: Mapping[str, JsonValue], path: str, problems: list[str]
) -> JsonValue:
    """Append what is wrong with `value` to `problems`; return it as plain JSON."""
    actual = _json_type(value)
    types = _types(schema)
    if actual not in _PY_TYPES:
        problems.append(f"{_label(path)} is a {actual}, which is not a JSON value")
        return None
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{_label(path)} must be a finite number")
        return None
    if types and not any(_matches_type(value, t) for t in types):
        wanted = " or ".join(f"{'an' if t[0] in 'aeiou' else 'a'} {t}" for t in types)
        problems.append(f"{_label(path)} must be {wanted}, got {actual}")
        return None
    checked: JsonValue
    if isinstance(value, list | tuple):
        items = schema.get("items")
        item_schema: Mapping[str, JsonValue] = items if isinstance(items, dict) else {}
        checked = [
            _check_value(item, item_schema, f"{path}[{i}]", problems)
            for i, item in enumerate(value)
        ]
    elif isinstance(value, dict):
        checked = _check_object(value, schema, path, problems)
    elif isinstance(value, str | int | float) or value is None:  # bool is an int
        checked = value
    else:  # unreachable: _json_type admitted only JSON types above
        raise TypeError(f"not a JSON value: {actual}")
    enum = schema.get("enum")
    if isinstance(enum, list) and checked not in enum:
        problems.append(f"{_label(path)} must be one of {', '.join(map(repr, enum))}")
    return checked


def _check_object(
    value: dict[object, object], schema: Mapping[str, JsonValue], path: str, problems: list[str]
) -> dict[str, JsonValue]:
    props = _properties(schema)
    out: dict[str, JsonValue] = {}
    for name in _required(schema):
        if name not in value:
            problems.append(f"{_label(_join(path, name))} is required")
    extra_allowed = schema.get("additionalProperties", True) is not False
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"{_label(path)} has a non-string key {key!r}")
            continue
        if key not in props and not extra_allowed:
            accepted = ", ".join(props) or "none"
            problems.append(f"unexpected {_label(_join(path, key))} (accepted: {accepted})")
            continue
        out[key] = _check_value(item, props.get(key, {}), _join(path, key), problems)
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
