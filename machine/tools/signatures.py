"""Tool parameters as Python text: annotations, parameter lists and the policy note.

`ToolSpec.signature`, `usage` and `stub` are built from these, so the tool listing, the
`.pyi` stubs agent code is checked against and the error hints all show a tool's arguments
the same way: required ones first, JSON types as Python builtins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.schema import PY_TYPES, declared_types, property_schemas, required_names


def ordered_parameters(
    parameters: Mapping[str, JsonValue],
) -> list[tuple[str, Mapping[str, JsonValue], bool]]:
    """(name, schema, required), required ones first: the order a person reads them in."""
    required = required_names(parameters)
    params = [(n, s, n in required) for n, s in property_schemas(parameters).items()]
    return sorted(params, key=lambda p: not p[2])


def notes(decision: PolicyDecision, idempotent: bool) -> str:
    parts = {
        PolicyDecision.APPROVE: [],
        PolicyDecision.REQUIRE_APPROVAL: ["requires approval"],
        PolicyDecision.BLOCK: ["blocked by policy"],
    }[decision]
    if idempotent:
        parts = [*parts, "read-only"]
    return "; ".join(parts)


def annotation(schema: Mapping[str, JsonValue], shadowed: Sequence[str]) -> str:
    types = declared_types(schema)
    if not types:
        # `anyOf`/`oneOf` of typed schemas (an optional value, as FastAPI writes one) reads
        # as their union; anything else as Any.
        branches = schema.get("anyOf", schema.get("oneOf"))
        if (
            isinstance(branches, list)
            and branches
            and all(isinstance(b, dict) and declared_types(b) for b in branches)
        ):
            union = [annotation(b, shadowed) for b in branches if isinstance(b, dict)]
            return " | ".join(dict.fromkeys(union))
        return "Any"
    rendered: list[str] = []
    for t in types:
        py = PY_TYPES[t]
        items = schema.get("items")
        if t == "array" and isinstance(items, dict):
            py = f"list[{annotation(items, shadowed)}]"
        elif t == "object":
            py = "dict[str, Any]"
        rendered.append(qualify(py, shadowed))
    return " | ".join(rendered)


def qualify(text: str, shadowed: Sequence[str]) -> str:
    """`text` with each `shadowed` builtin written `builtins.<name>`."""
    for name in shadowed:
        text = re.sub(rf"(?<![\w.]){name}\b", f"builtins.{name}", text)
    return text


def parameter(
    name: str,
    schema: Mapping[str, JsonValue],
    required: bool,
    shadowed: Sequence[str],
    *,
    stub: bool = False,
) -> str:
    text = f"{name}: {annotation(schema, shadowed)}"
    if required:
        return text
    if stub or "default" not in schema:
        return f"{text} = ..."
    return f"{text} = {schema['default']!r}"
