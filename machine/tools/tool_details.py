"""What a model reads of a tool beyond its signature, within a bound: the tool's summary,
and the fields of each argument that is an object (an API's JSON or form body, an upstream
MCP tool's nested input), each with its type, its allowed values and whether it is
required, and each argument's allowed values.

A signature alone shows a body as `dict[str, Any]`, so a required `title` was learnt only
from the first refusal. The schema is the tool's own (`ToolSpec.parameters`), its `$ref`s
followed inside it (an OpenAPI tool carries the components it uses under `components`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

from lockgate.machine.tools.schema import PY_TYPES, declared_types
from lockgate.machine.tools.signatures import ordered_parameters
from lockgate.machine.tools.spec import ToolSpec

#: The most characters of detail one tool gets (its summary and fields); the rest is in
#: its `parameters` schema, which `describe_tools` also returns.
DETAIL_CHARS = 700
#: The most allowed values spelled out for one field.
SHOWN_VALUES = 8
#: How many `$ref`s, `allOf`s and nestings are followed for one field.
MAX_DEPTH = 8


def details(spec: ToolSpec, bound: int = DETAIL_CHARS) -> list[str]:
    """The lines shown under `spec`'s signature, at most `bound` characters in all."""
    lines = [spec.description.strip().splitlines()[0]] if spec.description.strip() else []
    root: Mapping[str, Any] = spec.parameters
    for name, schema, _ in ordered_parameters(spec.parameters):
        resolved = _resolved(root, schema)
        fields = _fields(root, resolved)
        if fields:
            lines.append(f"{name} fields: {', '.join(fields)}")
        elif "enum" in resolved:
            lines.append(f"{name}: one of {_values(resolved['enum'])}")
    return _bounded(lines, bound)


def _bounded(lines: list[str], bound: int) -> list[str]:
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) > bound:
            room = bound - used
            if room > 40:
                kept.append(line[: room - 1].rsplit(", ", 1)[0] + ", …")
            kept.append("… (the rest: its `parameters` schema)")
            break
        kept.append(line)
        used += len(line)
    return kept


def _resolved(root: Mapping[str, Any], schema: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """`schema` with its `$ref` followed and its `allOf` branches merged (properties and
    required names), as far as `MAX_DEPTH`."""
    out = dict(schema)
    ref = out.pop("$ref", None)
    if isinstance(ref, str) and depth < MAX_DEPTH:
        target = _pointed(root, ref)
        if isinstance(target, Mapping):
            out = {**_resolved(root, target, depth + 1), **out}
    branches = out.pop("allOf", None)
    if isinstance(branches, list) and depth < MAX_DEPTH:
        properties: dict[str, Any] = dict(out.get("properties") or {})
        required: list[Any] = list(out.get("required") or [])
        for branch in branches:
            if isinstance(branch, Mapping):
                part = _resolved(root, branch, depth + 1)
                properties.update(part.get("properties") or {})
                required += list(part.get("required") or [])
                for key in ("type", "enum", "items"):
                    if key in part:
                        out.setdefault(key, part[key])
        if properties:
            out["properties"], out["required"] = properties, required
    return out


def _pointed(root: Mapping[str, Any], ref: str) -> Any:
    """What a local JSON pointer (`#/components/schemas/issue`) names in `root`."""
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _fields(root: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return []
    required = set(schema.get("required") or [])
    named = sorted(properties.items(), key=lambda item: item[0] not in required)
    shown = []
    for name, field in named:
        if not isinstance(field, Mapping):
            continue
        text = f"{name}: {_type(root, field)}"
        shown.append(f"{text} (required)" if name in required else text)
    return shown


def _type(root: Mapping[str, Any], schema: Mapping[str, Any], depth: int = 0) -> str:
    """A field's type as a model reads it: `str`, `list[str]`, `"open" | "closed"`,
    `dict {name, color}` for an object, `int | str` for a choice."""
    resolved = _resolved(root, schema, depth)
    if "enum" in resolved:
        return _values(resolved["enum"])
    if "const" in resolved:
        return repr(resolved["const"])
    types = declared_types(resolved)
    if not types:
        choices = resolved.get("anyOf", resolved.get("oneOf"))
        if isinstance(choices, list) and choices and depth < MAX_DEPTH:
            rendered = [_type(root, c, depth + 1) for c in choices if isinstance(c, Mapping)]
            return " | ".join(dict.fromkeys(rendered)) or "Any"
        return "dict" if "properties" in resolved else "Any"
    rendered = []
    for kind in types:
        items = resolved.get("items")
        if kind == "array" and isinstance(items, Mapping) and depth < MAX_DEPTH:
            rendered.append(f"list[{_type(root, items, depth + 1)}]")
        elif kind == "object":
            inner = resolved.get("properties")
            keys = list(inner)[:6] if isinstance(inner, Mapping) else []
            more = ", …" if isinstance(inner, Mapping) and len(inner) > 6 else ""
            rendered.append(f"dict {{{', '.join(keys)}{more}}}" if keys else "dict")
        else:
            rendered.append(PY_TYPES.get(kind, "Any"))
    return " | ".join(rendered)


def _values(values: JsonValue) -> str:
    if not isinstance(values, list):
        return "Any"
    shown = " | ".join(repr(v) for v in values[:SHOWN_VALUES])
    return shown + (f" | … ({len(values)} values)" if len(values) > SHOWN_VALUES else "")
