"""JSON Schema's `pattern` as JSON Schema means it: an ECMA-262 (JavaScript) regular
expression, compiled and run by `regress` (Rust's regress crate, an ECMA-262 engine), not by
Python's `re`, which refuses much of what real documents publish (`\\p{L}`, `[\\w-.]`) and
reads some of the rest otherwise.

A pattern is compiled in Unicode mode (the `u` flag, which `\\p{L}` needs, as JSON Schema's
own test suite expects); one that mode refuses is compiled as a browser's `new RegExp(p)`
would (Annex B's legacy syntax: `\\_`, `[\\w-.]` mean what their author meant there), except
a `\\p{...}`/`\\P{...}` escape, which legacy syntax would read as the letter `p` and match
nothing the author meant (`\\p{XDigit}`, Java's classes): such a pattern is not taken.

Used for the `pattern` and `patternProperties` keywords and the `regex` format, both when a
schema is checked (the metaschema's `format: regex`) and when a call's arguments are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from typing import Any

from jsonschema import FormatChecker, ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend
from regress import Regex, RegressError

#: A `\p` or `\P` escape: an odd number of backslashes before it.
_PROPERTY_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\[pP]")
_SURROGATE = re.compile("[\ud800-\udfff]")


@lru_cache(maxsize=8192)
def ecma_regex(pattern: str) -> Regex:
    """`pattern` compiled; ValueError in words where it is not an ECMA-262 expression."""
    try:
        return Regex(pattern, "u")
    except RegressError as unicode_error:
        if _PROPERTY_ESCAPE.search(pattern) is None:
            try:
                return Regex(pattern)
            except RegressError:
                pass
        reason = str(unicode_error)
        raise ValueError(
            f"{pattern!r} is not an ECMA-262 regular expression: {reason[:1].lower()}{reason[1:]}"
        ) from None
    except UnicodeEncodeError:
        raise ValueError(f"{pattern!r} holds a lone surrogate, which no expression may") from None


def matches(pattern: str, text: str) -> bool:
    """Whether `pattern` matches anywhere in `text` (unanchored, as JSON Schema's `pattern`)."""
    compiled = ecma_regex(pattern)
    try:
        return compiled.find(text) is not None
    except UnicodeEncodeError:  # a lone surrogate (JSON allows "\ud800"): not a character
        return compiled.find(_SURROGATE.sub("\ufffd", text)) is not None


def _pattern(
    validator: Validator, pattern: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not matches(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Validator, patterns: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if matches(pattern, key):
                # jsonschema's own validators descend so; its protocol leaves `descend` out.
                descend: Any = getattr(validator, "descend")  # noqa: B009
                yield from descend(value, subschema, path=key, schema_path=pattern)


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str):
        ecma_regex(instance)  # raises ValueError, which the format checker reports
    return True


@cache
def with_ecma_patterns(dialect: type[Validator]) -> type[Validator]:
    """`dialect`, its `pattern` and `patternProperties` run as ECMA-262 expressions."""
    keywords = {"pattern": _pattern, "patternProperties": _pattern_properties}
    ours = {keyword: check for keyword, check in keywords.items() if keyword in dialect.VALIDATORS}
    extended: type[Validator] = extend(dialect, validators=ours)  # type: ignore[no-untyped-call]
    return extended


def ecma_format_checker(base: FormatChecker | None = None) -> FormatChecker:
    """A format checker (every format of `base`, else every installed one) whose `regex`
    is an ECMA-262 expression."""
    checker = FormatChecker()
    if base is not None:
        checker.checkers = dict(base.checkers)
    checker.checkers["regex"] = (_is_regex, ValueError)
    return checker
