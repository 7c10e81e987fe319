"""The small JSON Schema subset tool parameters are written in, and its check at registration.

Supported: type (one or a list), properties, required, additionalProperties (boolean), items,
enum. Other keywords (description, default, format, ...) are accepted and ignored: the tool
itself still refuses what it cannot use. `check_schema` runs when a `ToolSpec` is made, so a
schema the argument check (`machine.tools.arguments`) would misread fails at start-up, not at
a call; the readers below are shared by that check and by the signatures and stubs.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

PY_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}
"""Each supported JSON type and the Python builtin that annotates it."""


def declared_types(schema: Mapping[str, JsonValue]) -> list[str]:
    declared = schema.get("type")
    if declared is None:
        return []
    if isinstance(declared, str):
        return [declared]
    return [str(t) for t in declared] if isinstance(declared, list) else []


def property_schemas(schema: Mapping[str, JsonValue]) -> dict[str, Mapping[str, JsonValue]]:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    return {name: s for name, s in props.items() if isinstance(s, dict)}


def required_names(schema: Mapping[str, JsonValue]) -> list[str]:
    names = schema.get("required")
    return [str(n) for n in names] if isinstance(names, list) else []


def check_schema(schema: Mapping[str, JsonValue], where: str) -> None:
    """Refuse, at registration, schemas the validator would misread at call time."""
    declared = schema.get("type")
    if declared is not None and not (
        isinstance(declared, str) or (isinstance(declared, list) and declared)
    ):
        raise ValueError(f"{where}: 'type' must be a string or a non-empty list")
    for t in declared_types(schema):
        if t not in PY_TYPES:
            raise ValueError(f"{where}: unsupported type {t!r}")
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(s, dict) for s in props.values()):
        raise ValueError(f"{where}: 'properties' must map names to schemas")
    names = schema.get("required", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}: 'required' must be a list of names")
    if not isinstance(schema.get("additionalProperties", True), bool):
        raise ValueError(f"{where}: only boolean 'additionalProperties' is supported")
    items = schema.get("items", {})
    if not isinstance(items, dict):
        raise ValueError(f"{where}: 'items' must be one schema")
    if not isinstance(schema.get("enum", []), list):
        raise ValueError(f"{where}: 'enum' must be a list")
    for name, sub in property_schemas(schema).items():
        check_schema(sub, f"{where}.{name}")
    if items:
        check_schema(items, f"{where}[]")
