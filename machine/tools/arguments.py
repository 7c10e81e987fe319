"""Checking a call's arguments against its tool's schema (the subset of `machine.tools.schema`).

The registry runs this before anything is journaled or paused for approval, so a person is
never asked to approve a call that could not run. Every problem found is reported, each named
by its argument's path (`filter.ids[0]`), with the tool's signature as the hint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import JsonValue

from lockgate.machine.tools.errors import InvalidArguments
from lockgate.machine.tools.schema import PY_TYPES, declared_types, property_schemas, required_names
from lockgate.machine.tools.spec import ToolSpec


def check_arguments(
    spec: ToolSpec, kwargs: dict[str, JsonValue], args: list[JsonValue]
) -> dict[str, JsonValue]:
    """Checked (and JSON-normalised: tuples become lists) keyword arguments for a call.

    Raises InvalidArguments, naming the tool, the argument and the problem.
    """
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


def _usage_hint(spec: ToolSpec) -> str:
    return f"Call it as {spec.bare_signature()}, with keyword arguments."


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
    types = declared_types(schema)
    if actual not in PY_TYPES:
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
    props = property_schemas(schema)
    out: dict[str, JsonValue] = {}
    for name in required_names(schema):
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
