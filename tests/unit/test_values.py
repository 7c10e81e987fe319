"""Sandbox values as JSON: every value converts, and size limits hold."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, time
from decimal import Decimal
from enum import Enum, IntEnum, StrEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from lockgate.machine.values import (
    BYTES_KEY,
    MAX_DEPTH,
    MIN_LIMIT_BYTES,
    json_size,
    limit_size,
    limit_text,
    to_json,
)


def compact(value: JsonValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Color(Enum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


class Mode(StrEnum):
    FAST = "fast"


class Shouting(str):
    """A str subclass whose own __str__ says something else: the plain value is what counts."""

    def __str__(self) -> str:
        return "SHOUTING"


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (3, 3),
        (10**30, 10**30),
        (1.5, 1.5),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
        ("héllo", "héllo"),
        (Decimal("1.10"), "1.10"),
        (b"\x00ab", {BYTES_KEY: "AGFi"}),
        (bytearray(b"x"), {BYTES_KEY: "eA=="}),
        (date(2026, 11, 30), "2026-11-30"),
        (datetime(2026, 11, 30, 12, 0, tzinfo=UTC), "2026-11-30T12:00:00+00:00"),
        (time(8, 30), "08:30:00"),
        ((1, (2, 3)), [1, [2, 3]]),
        ({3, 1, 2}, [1, 2, 3]),
        (frozenset({10, 9}), [9, 10]),
        (
            {1: "a", None: "b", False: "c", 2.5: "d", (1, 2): "e", b"k": "f"},
            {
                "1": "a",
                "null": "b",
                "false": "c",
                "2.5": "d",
                "[1,2]": "e",
                '{"$bytes_base64":"aw=="}': "f",
            },
        ),
        (Level.HIGH, 3),
        (Mode.FAST, "fast"),
        (Shouting("quiet"), "quiet"),
        (ValueError("x"), "ValueError('x')"),
    ],
)
def test_to_json_converts(value: object, expected: JsonValue) -> None:
    out = to_json(value)
    json.dumps(out, allow_nan=False)  # always encodable, without NaN literals
    assert out == expected
    assert type(out) is type(expected)


def test_to_json_falls_back_to_repr_and_never_raises() -> None:
    assert to_json(Color.RED) == "<Color.RED: 'red'>"
    assert to_json(BadRepr()) == "<BadRepr>"
    assert to_json(print) == "<built-in function print>"


def test_unorderable_sets_are_sorted_by_their_json() -> None:
    out = to_json({"b", 1, (2, "a")})
    assert out == sorted(out, key=json.dumps)  # type: ignore[arg-type]
    assert out == ["b", 1, [2, "a"]]  # each item converted (the tuple to a list)
    assert to_json({"b", 1, (2, "a")}) == out


def test_cycles_and_deep_nesting_are_cut() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert to_json(loop) == ["<cycle>"]
    deep: list[object] = []
    for _ in range(10_000):
        deep = [deep]
    out = to_json(deep)
    assert "<nested too deeply>" in compact(out)
    # A value seen twice, but not inside itself, is not a cycle.
    shared = [1]
    assert to_json([shared, shared]) == [[1], [1]]


def nested(levels: int, inner: object) -> object:
    value = inner
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_is_cut_exactly_past_max_depth() -> None:
    # MAX_DEPTH containers convert whole; the one below them becomes the marker.
    assert to_json(nested(MAX_DEPTH, 1)) == nested(MAX_DEPTH, 1)
    assert to_json(nested(MAX_DEPTH + 1, 1)) == nested(MAX_DEPTH, "<nested too deeply>")
    # Inside a dict the depth counts the same way.
    assert to_json({"a": nested(MAX_DEPTH - 1, 1)}) == {"a": nested(MAX_DEPTH - 1, 1)}
    assert to_json({"a": nested(MAX_DEPTH, 1)}) == {
        "a": nested(MAX_DEPTH - 1, "<nested too deeply>")
    }


def test_limit_size_keeps_small_values() -> None:
    value: JsonValue = {"a": [1, 2, 3]}
    assert limit_size(value, MIN_LIMIT_BYTES) is value


@pytest.mark.parametrize("filler", ["x", '"', "\x00", "é", "😀"])
def test_limit_size_marker_fits(filler: str) -> None:
    value: JsonValue = {"data": filler * 5_000}
    size = json_size(value)
    for max_bytes in (MIN_LIMIT_BYTES, 300, 1000, 4096):
        out = limit_size(value, max_bytes)
        assert isinstance(out, dict)
        assert out["truncated"] is True
        assert out["original_bytes"] == size
        assert json_size(out) <= max_bytes
        assert compact(value).startswith(str(out["preview"]))
        assert out["note"] == (
            f"result exceeded {max_bytes} bytes; the preview is the start of its JSON "
            "text, cut to fit"
        )
        # The preview is the longest that fits: one more character would not.
        preview = str(out["preview"])
        longer = {**out, "preview": compact(value)[: len(preview) + 1]}
        assert json_size(longer) > max_bytes
    assert len(str(limit_size(value, 4096)["preview"])) > 0  # type: ignore[index,call-overload]


def test_limit_size_boundary() -> None:
    value: JsonValue = "x" * 1000
    assert limit_size(value, json_size(value)) == value
    assert isinstance(limit_size(value, json_size(value) - 1), dict)


def test_limit_size_rejects_a_limit_too_small_for_its_marker() -> None:
    with pytest.raises(ValueError, match="at least"):
        limit_size("x" * 1000, MIN_LIMIT_BYTES - 1)


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=40,
    ),
    st.integers(MIN_LIMIT_BYTES, 2000),
)
def test_limit_size_always_within_the_limit(value: JsonValue, max_bytes: int) -> None:
    out = limit_size(value, max_bytes)
    assert json_size(out) <= max_bytes
    assert out == value or (isinstance(out, dict) and out.get("truncated") is True)


def test_limit_text() -> None:
    assert limit_text("short", 10) == "short"
    assert limit_text("exact", 5) == "exact"  # at the limit: nothing cut, no marker
    assert limit_text("abcdef", 4) == "abcd\n… [truncated: 2 more characters]"
    assert math.isclose(
        len(limit_text("x" * 100, 10)), 10 + len("\n… [truncated: 90 more characters]")
    )


def test_an_orderable_set_of_tuples_converts_each_tuple() -> None:
    assert to_json({(3, 4), (1, 2)}) == [[1, 2], [3, 4]]
    assert to_json(frozenset({("b",), ("a",)})) == [["a"], ["b"]]
