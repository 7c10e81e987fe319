"""Whether a schema is valid is `jsonschema`'s verdict, in its words, however it is reached:
the Rust check that spares most schemas the Python one (`schema_check`) never lets through a
schema the metaschema refuses, even where it alone would (a Java character class such as
`\\p{XDigit}`, which no ECMA-262 engine knows), and never changes what a refusal says."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema.validators import Draft7Validator, Draft202012Validator

from lockgate.machine.tools.schema_check import schema_problem

REFUSED: list[tuple[dict[str, Any], tuple[str, str]]] = [
    (
        {"type": "object", "properties": {"id": {"type": "string", "pattern": "\\p{XDigit}+"}}},
        (
            "properties/id/pattern",
            "'\\\\p{XDigit}+' is not an ECMA-262 regular expression: invalid property name",
        ),
    ),
    (
        {"patternProperties": {"^[a-": {}}},
        ("patternProperties", "'^[a-' is not an ECMA-262 regular expression: unbalanced bracket"),
    ),
    (
        {"type": "strnig"},
        (
            "type",
            "'strnig' is not a JSON type (array, boolean, integer, null, number, object, string)",
        ),
    ),
    ({"$ref": "#/components/a b"}, ("$ref", "'#/components/a b' is not a 'uri-reference'")),
    ({"minLength": -1}, ("minLength", "-1 is less than the minimum of 0")),
    ({"required": ["a", "a"]}, ("required", "['a', 'a'] has non-unique elements")),
]


@pytest.mark.parametrize(("schema", "problem"), REFUSED)
def test_a_schema_the_metaschema_refuses_is_refused_in_its_words(
    schema: dict[str, Any], problem: tuple[str, str]
) -> None:
    assert schema_problem(Draft202012Validator, schema) == problem


def test_what_the_metaschema_takes_is_taken() -> None:
    published = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[-._\\p{L}\\p{N}]+$"},
            "select": {"type": "array", "items": {"enum": ["id", "displayName"]}},
            "user": {"$ref": "#/components/schemas/microsoft.graph.user"},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert schema_problem(Draft202012Validator, published) is None
    assert schema_problem(Draft7Validator, {"type": "string", "pattern": "^a"}) is None
