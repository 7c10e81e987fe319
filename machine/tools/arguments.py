"""Checking a call's arguments against its tool's JSON Schema, with the `jsonschema` library.

The registry runs this before anything is journaled or paused for approval, so a person is
never asked to approve a call that could only fail. Every keyword of the schema's dialect is
enforced (2020-12 unless the schema names another in `$schema`), `format` included; every
problem found is reported, each named by its argument's path (`filter.ids[0]`) and the rule
it breaks, with the tool's signature as the hint.

What the library does not do is turn the code's values into JSON first: tuples become lists,
and what JSON cannot hold (a non-string key, NaN, a value of no JSON type) is refused here,
before the schema is asked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema import ValidationError
from pydantic import JsonValue

from lockgate.machine.tools.errors import InvalidArguments
from lockgate.machine.tools.spec import ToolSpec

#: The longest text one rule's problem may take (the library's own message quotes the value,
#: which can be as long as the code made it).
PROBLEM_CHARS = 300


def check_arguments(
    spec: ToolSpec, kwargs: dict[str, JsonValue], args: list[JsonValue]
) -> dict[str, JsonValue]:
    """Checked (and JSON-normalised: tuples become lists) keyword arguments for a call.

    Raises InvalidArguments, naming the tool, each argument and the rule it breaks.
    """
    if args:
        raise InvalidArguments(
            tool=spec.full_name,
            problems=[
                f"got {len(args)} positional argument(s); call tools with keyword "
                f"arguments: {spec.usage()}"
            ],
            usage=usage_hint(spec),
        )
    problems: list[str] = []
    plain = _as_json(kwargs, "", problems)
    if not problems:
        errors = spec.argument_validator.iter_errors(plain)
        # One line per problem, in a stable order (the library yields them as it walks).
        problems = list(dict.fromkeys(_describe(e) for e in sorted(errors, key=_order)))
    if problems or not isinstance(plain, dict):
        raise InvalidArguments(tool=spec.full_name, problems=problems, usage=usage_hint(spec))
    return plain


def usage_hint(spec: ToolSpec) -> str:
    """The hint every argument refusal ends with."""
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


def _label(path: str) -> str:
    return f"argument {path!r}" if path else "the arguments"


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _as_json(value: object, path: str, problems: list[str]) -> JsonValue:
    """`value` as plain JSON; what JSON cannot hold is appended to `problems`."""
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{_label(path)} must be a finite number")
        return None
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    if isinstance(value, list | tuple):
        return [_as_json(item, _join(path, i), problems) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{_label(path)} has a non-string key {key!r}")
                continue
            out[key] = _as_json(item, _join(path, key), problems)
        return out
    problems.append(f"{_label(path)} is a {_json_type(value)}, which is not a JSON value")
    return None


def _path(error: ValidationError) -> str:
    path = ""
    for key in error.absolute_path:
        path = _join(path, key)
    return path


def _order(error: ValidationError) -> tuple[bool, str, str]:
    """Missing arguments first, then by the argument a problem is about, then by rule."""
    subject = _path(error)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        declared = schema.get("properties", {})
        extra = [key for key in error.instance if key not in declared]
        subject = _join(subject, str(extra[0])) if extra else subject
    return error.validator != "required", subject, str(error.validator)


def _describe(error: ValidationError) -> str:
    """One problem: the argument, what the rule wants, and the rule's name."""
    path, rule, wanted = _path(error), str(error.validator), error.validator_value
    instance: Any = error.instance
    if rule == "required" and isinstance(instance, dict) and isinstance(wanted, list):
        missing = [name for name in wanted if name not in instance]
        return "; ".join(f"{_label(_join(path, name))} is required" for name in missing)
    if rule == "additionalProperties" and wanted is False and isinstance(instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        declared = schema.get("properties", {})
        if isinstance(declared, Mapping) and "patternProperties" not in schema:
            accepted = ", ".join(declared) or "none"
            extra = [key for key in instance if key not in declared]
            return "; ".join(
                f"unexpected {_label(_join(path, key))} (accepted: {accepted})" for key in extra
            )
    if rule == "type":
        types = [wanted] if isinstance(wanted, str) else list(_strings(wanted))
        alternatives = " or ".join(f"{'an' if t[0] in 'aeiou' else 'a'} {t}" for t in types)
        return f"{_label(path)} must be {alternatives}, got {_json_type(instance)}"
    if rule == "enum" and isinstance(wanted, list):
        return f"{_label(path)} must be one of {', '.join(map(repr, wanted))}"
    text = f"{_label(path)}: {error.message} (rule: {rule})"
    if len(text) > PROBLEM_CHARS:
        text = f"{text[: PROBLEM_CHARS - 20]}… (rule: {rule})"
    return text


def _strings(values: object) -> Iterable[str]:
    return (str(v) for v in values) if isinstance(values, list) else ()
