"""Tool parameters are JSON Schema: their check at registration, the validator that checks a
call's arguments, and the readers the signatures and stubs share.

Any schema of a dialect `jsonschema` knows is accepted (2020-12 unless it names another in
`$schema`), and every keyword of it is enforced at a call (`machine.tools.arguments`).
`check_schema` runs when a `ToolSpec` is made, so a schema that is not valid fails at
start-up (or when a source is added), not at a call. Signatures and stubs render the common
shape (`type`, `properties`, `required`, `items`); anything richer reads as `Any` there.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from jsonschema import FormatChecker
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic import JsonValue

from lockgate.machine.tools.ecma_patterns import ecma_format_checker, with_ecma_patterns
from lockgate.machine.tools.schema_check import schema_problem

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


def _dialect(schema: Mapping[str, Any]) -> type[Validator]:
    return validator_for(schema, default=validator_for({}))


def check_schema(schema: Mapping[str, Any], where: str) -> None:
    """Refuse, at registration, a schema that is not valid in its dialect (an unknown type, a
    `required` that is not a list of names, a `pattern` that is not an ECMA-262 regular
    expression...): `machine.tools.schema_check`, which remembers what it has checked."""
    found = schema_problem(_dialect(schema), schema)
    if found is not None:
        at, message = found
        raise ValueError(
            f"{where}{f' at {at}' if at else ''} is not a valid JSON Schema: {message}"
        )


def schema_validator(schema: Mapping[str, JsonValue]) -> Validator:
    """A validator for `schema` in its own dialect that checks `format` too (each format whose
    checker is installed, pyproject.toml lists them: date-time, email, uri, uuid, ipv4...;
    not `iri`, whose checker costs most of a second of every boot), its `pattern`s read as
    ECMA-262 expressions (`machine.tools.ecma_patterns`)."""
    return with_ecma_patterns(_dialect(schema))(schema, format_checker=_formats())


@cache
def _formats() -> FormatChecker:
    return ecma_format_checker()
