"""Whether a schema is valid in its dialect (its metaschema asked, `jsonschema`'s own), in
words, at a cost that follows the distinct schemas seen, not the tools.

`jsonschema` checks a 2020-12 schema in milliseconds (every keyword a `$dynamicRef` away),
and a real API repeats the same schemas across thousands of tools (Microsoft Graph's 22,000
operations share a few thousand definitions and argument shapes). So each argument's schema
is checked on its own and remembered by its JSON text, then the rest with `{}` in their
places, remembered with the argument names numbered (tools differ in them, seldom in the
rest) and without the keywords no metaschema looks at (an OpenAPI tool's carried
`components`, each part of which its source checks once). Where a remembered check finds a
problem, it is found again on the schema as it is, so its words name what the schema names.
Drafts 3 and 4 are checked whole.

Before `jsonschema` is asked, `jsonschema_rs` (Rust) checks the schema against the same
metaschema, formats included, and every `pattern` in it is compiled as ECMA-262
(`ecma_patterns`; `jsonschema_rs` reads a few Java classes such as `\\p{XDigit}` that no
ECMA-262 engine knows). A schema both pass is valid; any other is asked of `jsonschema`,
whose verdict and words are the ones given: the Rust check only spares the Python one the
schemas it would find valid (most of every published API), never says a schema is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from typing import Any

import jsonschema_rs
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import Draft3Validator, Draft4Validator

from lockgate.machine.tools.ecma_patterns import ecma_format_checker, ecma_regex

Problem = tuple[str, str]  # where (a path in the schema), and what is wrong
JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")

#: Keywords a metaschema constrains that are not validators (annotations, identifiers,
#: definitions); any other keyword a validator does not know, no metaschema looks at.
_CONSTRAINED = frozenset(
    {
        "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary",
        "$comment", "$defs", "definitions", "title", "description", "default", "examples",
        "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
        "contentSchema",
    }
)  # fmt: skip


@cache
def _meta(dialect: type[Validator]) -> Validator:
    """The validator of `dialect`'s metaschema, whose `format: regex` is ECMA-262's."""
    return dialect(dialect.META_SCHEMA, format_checker=ecma_format_checker(dialect.FORMAT_CHECKER))


@cache
def _quick_meta(dialect: type[Validator]) -> jsonschema_rs.Validator | None:
    """`dialect`'s metaschema in Rust, its formats asserted; None for a dialect it lacks."""
    try:
        return jsonschema_rs.validator_for(dialect.META_SCHEMA, validate_formats=True)
    except ValueError:  # draft 3's metaschema, which it does not know
        return None


def _patterns(schema: Any) -> Iterator[str]:
    """Every text that may be a `pattern` in `schema` (a value named so, a key of a
    `patternProperties`), and a few that are not (inside a `default`): all are compiled."""
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
        elif isinstance(node, Mapping):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    yield value
                elif key == "patternProperties" and isinstance(value, Mapping):
                    yield from (p for p in value if isinstance(p, str))
                todo.append(value)


def _valid_quickly(dialect: type[Validator], schema: Any) -> bool:
    """Whether the Rust check finds `schema` (plain JSON, as `json` reads it: the Rust side
    takes a value of another type, a YAML date, for anything) valid and each of its
    patterns compiles; False is no verdict (`jsonschema` is asked)."""
    quick = _quick_meta(dialect)
    if quick is None or not quick.is_valid(schema):
        return False
    try:
        for pattern in _patterns(schema):
            ecma_regex(pattern)
    except ValueError:
        return False
    return True


def _asked(dialect: type[Validator], schema: Any) -> Problem | None:
    """The metaschema asked: its most relevant error (`best_match`), in words, or None."""
    error = best_match(_meta(dialect).iter_errors(schema))
    if error is None:
        return None
    at = "/".join(str(part) for part in error.absolute_path)
    message = error.message
    if error.validator == "anyOf" and list(error.absolute_path)[-1:] == ["type"]:
        # The metaschema's anyOf over one name or a list of them says only "not valid
        # under any of the given schemas".
        message = f"{error.instance!r} is not a JSON type ({', '.join(JSON_TYPES)})"
    elif error.validator == "format" and error.validator_value == "regex" and error.cause:
        message = str(error.cause)  # what is wrong with it, in words
    return at, message


def _lean(schema: Any) -> Any:
    """`schema` with each `enum` and `examples` list emptied: from draft 6 on, a metaschema
    asks of them only that they be lists, and walks every item to ask nothing (Microsoft
    Graph's `$select` lists hundreds of names)."""
    if isinstance(schema, list):
        return [_lean(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    return {
        key: [] if key in ("enum", "examples") and isinstance(value, list) else _lean(value)
        for key, value in schema.items()
    }


def _within(key: str, name: object, problem: Problem) -> Problem:
    at, message = problem
    return f"{key}/{name}" + (f"/{at}" if at else ""), message


@lru_cache(maxsize=8192)
def _of_text(dialect: type[Validator], text: str) -> Problem | None:
    schema = json.loads(text)
    return None if _valid_quickly(dialect, schema) else _asked(dialect, schema)


def _remembered(dialect: type[Validator], schema: Any) -> Problem | None:
    if not isinstance(schema, Mapping):
        return _asked(dialect, schema)  # a boolean schema, or not a schema at all
    try:
        text = json.dumps(_lean(schema), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # not plain JSON (a YAML date): checked as it is
        return _asked(dialect, schema)
    return _of_text(dialect, text)


def schema_problem(dialect: type[Validator], schema: Mapping[str, Any]) -> Problem | None:
    """Where `schema` (a tool's parameters, a part of a document) is not valid in
    `dialect`, and why; None when it is."""
    if dialect in (Draft3Validator, Draft4Validator):  # they ask more of an enum, of `{}`
        return _asked(dialect, dict(schema))
    checked = {k: v for k, v in schema.items() if k in dialect.VALIDATORS or k in _CONSTRAINED}
    properties = checked.get("properties")
    if not isinstance(properties, Mapping):
        return _remembered(dialect, checked)
    for name, sub in properties.items():
        if (found := _remembered(dialect, sub)) is not None:
            return _within("properties", name, found)
    numbered = {name: f"p{i}" for i, name in enumerate(properties)}
    rest = {**checked, "properties": {key: {} for key in numbered.values()}}
    required = rest.get("required")
    if isinstance(required, list):
        rest["required"] = [numbered.get(r, r) if isinstance(r, str) else r for r in required]
    if _remembered(dialect, rest) is None:
        return None
    return _asked(dialect, {**checked, "properties": {key: {} for key in properties}})
