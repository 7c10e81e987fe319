"""The tool registry's argument validation: a call's keyword arguments checked against the
tool's JSON schema (required, types, nested values, enums, extra arguments), every problem
reported, and the accepted values normalised to JSON.

The registry's specs, lookup and discovery are tests/unit/test_tools_registry.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import JsonValue

from lockgate.machine.errors import ErrorCode
from lockgate.machine.tools import InvalidArguments, Tool, ToolRegistry, UnknownTool
from tests.support.tool_sources import EchoTool, spec

pytest_plugins = ["tests.support.tool_sources"]


# -- argument validation -------------------------------------------------------------------


def invalid(registry: ToolRegistry, name: str, **kwargs: Any) -> InvalidArguments:
    with pytest.raises(InvalidArguments) as caught:
        registry.validate_arguments(name, kwargs, [])
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    return caught.value


def test_valid_arguments_pass_as_a_copy(registry: ToolRegistry) -> None:
    kwargs: dict[str, JsonValue] = {"key": "a", "text": "b"}
    checked = registry.validate_arguments("tools.notes.write", kwargs, [])
    assert checked == kwargs and checked is not kwargs


def test_missing_required_argument(registry: ToolRegistry) -> None:
    error = invalid(registry, "notes.write", key="a")
    assert error.message == "tools.notes.write: argument 'text' is required"
    assert (
        error.hint
        == "Call it as tools.notes.write(key: str, text: str) -> dict, with keyword arguments."
    )


def test_wrong_type(registry: ToolRegistry) -> None:
    error = invalid(registry, "notes.write", key=1, text="b")
    assert error.message == "tools.notes.write: argument 'key' must be a string, got integer"


def test_extra_argument(registry: ToolRegistry) -> None:
    error = invalid(registry, "notes.write", key="a", text="b", colour="red")
    assert error.problems == ("unexpected argument 'colour' (accepted: key, text)",)
    error = invalid(registry, "notes.list", everything=True)
    assert error.problems == ("unexpected argument 'everything' (accepted: none)",)


def test_positional_arguments_are_refused(registry: ToolRegistry) -> None:
    with pytest.raises(InvalidArguments) as caught:
        registry.validate_arguments("notes.write", {}, ["a", "b"])
    assert caught.value.message == (
        "tools.notes.write: got 2 positional argument(s); call tools with keyword arguments: "
        "tools.notes.write(key=..., text=...)"
    )


def test_every_problem_is_reported(registry: ToolRegistry) -> None:
    error = invalid(registry, "notes.write", key=None, unknown=1)
    assert error.problems == (
        "argument 'text' is required",
        "argument 'key' must be a string, got null",
        "unexpected argument 'unknown' (accepted: key, text)",
    )


def test_unknown_tool_while_validating(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool):
        registry.validate_arguments("notes.wipe", {}, [])


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"limit": True}, "argument 'limit' must be an integer, got boolean"),
        ({"limit": 1.5}, "argument 'limit' must be an integer, got number"),
        ({"ratio": "x"}, "argument 'ratio' must be a number, got string"),
        ({"ratio": float("nan")}, "argument 'ratio' must be a finite number"),
        ({"exact": 1}, "argument 'exact' must be a boolean, got integer"),
        ({"tags": "a"}, "argument 'tags' must be an array, got string"),
        ({"tags": ["a", 2]}, "argument 'tags[1]' must be a string, got integer"),
        ({"filter": []}, "argument 'filter' must be an object, got array"),
        ({"filter": {"ids": [1, "2"]}}, "argument 'filter.ids[1]' must be an integer, got string"),
        ({"filter": {"x": 1}}, "unexpected argument 'filter.x' (accepted: ids)"),
        ({"filter": {1: 1}}, "argument 'filter' has a non-string key 1"),
        ({"order": "up"}, "argument 'order' must be one of 'asc', 'desc'"),
        ({"cursor": 3}, "argument 'cursor' must be a string or a null, got integer"),
        ({"extra": {1, 2}}, "argument 'extra' is a set, which is not a JSON value"),
        ({"extra": b"x"}, "argument 'extra' is a bytes, which is not a JSON value"),
    ],
)
def test_type_checks(registry: ToolRegistry, kwargs: dict[str, Any], problem: str) -> None:
    error = invalid(registry, "docs.search", query="q", **kwargs)
    assert error.problems == (problem,)
    assert error.message.startswith("tools.docs.search: ")


def test_accepted_values_are_normalised_to_json(registry: ToolRegistry) -> None:
    checked = registry.validate_arguments(
        "docs.search",
        {
            "query": "q",
            "limit": 3,
            "ratio": 2,  # an integer is a number
            "tags": ("a", "b"),  # type: ignore[dict-item]  # sandboxes may pass tuples
            "filter": {"ids": [1]},
            "order": "asc",
            "cursor": None,
            "extra": {"anything": [1, "x", None]},
        },
        [],
    )
    assert checked["tags"] == ["a", "b"]
    assert checked["ratio"] == 2
    assert checked["extra"] == {"anything": [1, "x", None]}


def test_additional_properties_allowed_unless_false() -> None:
    class Open:
        name = "open"

        def tools(self) -> Sequence[Tool]:
            schema: dict[str, JsonValue] = {"type": "object", "properties": {"a": {}}}
            return [EchoTool(spec(source="open", parameters=schema))]

    registry = ToolRegistry()
    registry.register(Open())
    assert registry.validate_arguments("open.t", {"a": 1, "b": 2}, []) == {"a": 1, "b": 2}


# -- every rule of the schema, not only types (the library's whole dialect) ----------------

RULES: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "slug": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        "when": {"type": "string", "format": "date-time"},
        "email": {"type": "string", "format": "email"},
        "ids": {"type": "array", "items": {"type": "integer"}, "maxItems": 2, "uniqueItems": True},
        "mode": {"const": "fast"},
        "target": {"$ref": "#/$defs/target"},
        "either": {"oneOf": [{"type": "integer"}, {"type": "string", "minLength": 3}]},
    },
    "$defs": {
        "target": {
            "type": "object",
            "properties": {"port": {"type": "integer", "exclusiveMinimum": 0}},
            "required": ["port"],
        }
    },
    "additionalProperties": False,
}


@pytest.fixture(name="rules")
def rules_fixture() -> ToolRegistry:
    class Rules:
        name = "rules"

        def tools(self) -> Sequence[Tool]:
            return [EchoTool(spec(source="rules", parameters=RULES))]

    registry = ToolRegistry()
    registry.register(Rules())
    return registry


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"count": 0}, "argument 'count': 0 is less than the minimum of 1 (rule: minimum)"),
        ({"count": 11}, "argument 'count': 11 is greater than the maximum of 10 (rule: maximum)"),
        ({"slug": "Bob"}, "argument 'slug': 'Bob' does not match '^[a-z]+$' (rule: pattern)"),
        ({"slug": "abcdefghi"}, "argument 'slug': 'abcdefghi' is too long (rule: maxLength)"),
        ({"when": "noon"}, "argument 'when': 'noon' is not a 'date-time' (rule: format)"),
        ({"email": "nobody"}, "argument 'email': 'nobody' is not a 'email' (rule: format)"),
        ({"ids": [1, 1]}, "argument 'ids': [1, 1] has non-unique elements (rule: uniqueItems)"),
        ({"ids": [1, 2, 3]}, "argument 'ids': [1, 2, 3] is too long (rule: maxItems)"),
        ({"mode": "slow"}, "argument 'mode': 'fast' was expected (rule: const)"),
        ({"target": {}}, "argument 'target.port' is required"),
        (
            {"target": {"port": 0}},
            "argument 'target.port': 0 is less than or equal to the minimum of 0 "
            "(rule: exclusiveMinimum)",
        ),
        (
            {"either": "ab"},
            "argument 'either': 'ab' is not valid under any of the given schemas (rule: oneOf)",
        ),
    ],
)
def test_every_rule_of_the_schema_is_enforced_and_named(
    rules: ToolRegistry, kwargs: dict[str, Any], problem: str
) -> None:
    error = invalid(rules, "rules.t", **kwargs)
    assert error.problems == (problem,)


def test_arguments_that_keep_every_rule_pass(rules: ToolRegistry) -> None:
    kwargs: dict[str, JsonValue] = {
        "count": 10,
        "slug": "abc",
        "when": "2026-12-03T20:00:00Z",
        "email": "ops@example.org",
        "ids": [1, 2],
        "mode": "fast",
        "target": {"port": 1},
        "either": "abc",
    }
    assert rules.validate_arguments("rules.t", kwargs, []) == kwargs


def test_a_problem_quoting_a_long_value_is_cut_short(rules: ToolRegistry) -> None:
    (problem,) = invalid(rules, "rules.t", slug="x" * 5000).problems
    assert len(problem) <= 300
    assert problem.startswith("argument 'slug': 'xxx")
    assert problem.endswith("… (rule: maxLength)")
