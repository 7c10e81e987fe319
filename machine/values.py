"""Sandbox values as JSON, and size limits for what Lockgate stores or shows.

Everything the sandbox hands back (tool arguments, final results) goes through `to_json`
before it reaches the database or a client. Monty returns Python objects `json` cannot encode
(sets, bytes, datetimes, class proxies), and the agent chooses these values, so the conversion
must never fail: anything unknown becomes its repr string.

Choices, in one place:
- tuple, list, set and frozenset become lists; sets are sorted (by value when the items are
  orderable, else by their JSON text) so the same set always gives the same JSON.
- bytes become `{"$bytes_base64": "<base64>"}`, which is unambiguous and survives any
  encoding.
- dict keys that are not str become str: None/bool/int/float as `json` spells them ("null",
  "true", "1", "2.5"), anything else as its compact JSON text. Two keys that end up equal
  (1 and "1") keep the later value.
- date, datetime and time become ISO 8601 strings; Decimal becomes its str; float nan and
  infinities become "nan", "inf", "-inf" (JSON has no literal for them).
- Cycles become "<cycle>", and nesting deeper than `MAX_DEPTH` becomes "<nested too deeply>"
  (Monty already cuts its values at about 50 levels; this guards the host's own stack).
"""

from __future__ import annotations

import base64
import json
import math
from datetime import date, time
from decimal import Decimal

from pydantic import JsonValue

BYTES_KEY = "$bytes_base64"
MAX_DEPTH = 100
# The smallest max_bytes `limit_size` accepts: its marker, with an empty preview, needs ~170.
MIN_LIMIT_BYTES = 256


def to_json(value: object) -> JsonValue:
    """A JSON-serialisable version of `value`; never raises (see the module docstring)."""
    return _convert(value, 0, set())


def _convert(value: object, depth: int, path: set[int]) -> JsonValue:
    try:
        # bool before int: bool is an int subclass. type() checks drop str/int subclasses
        # (e.g. enums) to their plain values.
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            return value if type(value) is str else str.__str__(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value) if math.isfinite(value) else str(value)
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, bytes | bytearray | memoryview):
            return {BYTES_KEY: base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, date | time):  # datetime is a date
            return value.isoformat()
        if isinstance(value, dict | list | tuple | set | frozenset):
            if depth >= MAX_DEPTH:
                return "<nested too deeply>"
            if id(value) in path:
                return "<cycle>"
            path.add(id(value))
            try:
                return _container(value, depth + 1, path)
            finally:
                path.discard(id(value))
    except Exception:
        pass
    return _safe_repr(value)


_Container = (
    dict[object, object] | list[object] | tuple[object, ...] | set[object] | frozenset[object]
)


def _container(value: _Container, depth: int, path: set[int]) -> JsonValue:
    if isinstance(value, dict):
        return {_key(k, depth, path): _convert(v, depth, path) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_convert(v, depth, path) for v in value]
    try:
        ordered = sorted(value)  # type: ignore[type-var]  # may raise: caught below
    except Exception:
        items = [_convert(v, depth, path) for v in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    return [_convert(v, depth, path) for v in ordered]


def _key(key: object, depth: int, path: set[int]) -> str:
    converted = _convert(key, depth, path)
    return converted if isinstance(converted, str) else _dumps(converted)


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _dumps(value: JsonValue) -> str:
    """The compact JSON text sizes are measured on."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _size(text: str) -> int:
    # surrogatepass: a lone surrogate must be counted, not crash the measurement.
    return len(text.encode("utf-8", "surrogatepass"))


def json_size(value: JsonValue) -> int:
    """Bytes of the compact JSON encoding of `value` (the measure `limit_size` uses)."""
    return _size(_dumps(value))


def limit_size(value: JsonValue, max_bytes: int) -> JsonValue:
    """`value` itself if its compact JSON fits in `max_bytes`, else a truncation marker.

    The marker is `{"truncated": true, "original_bytes": N, "preview": "<start of the JSON
    text>", "note": "..."}` and its own compact JSON is at most `max_bytes`.
    """
    if max_bytes < MIN_LIMIT_BYTES:
        raise ValueError(f"max_bytes must be at least {MIN_LIMIT_BYTES}, got {max_bytes}")
    text = _dumps(value)
    size = _size(text)
    if size <= max_bytes:
        return value

    def marker(preview_chars: int) -> dict[str, JsonValue]:
        return {
            "truncated": True,
            "original_bytes": size,
            "preview": text[:preview_chars],
            "note": (
                f"result exceeded {max_bytes} bytes; the preview is the start of its JSON "
                "text, cut to fit"
            ),
        }

    # The largest preview that fits, by binary search: escaping (quotes, control
    # characters, multi-byte UTF-8) makes a character cost 1 to 6 bytes.
    low, high = 0, min(len(text), max_bytes)
    while low < high:
        mid = (low + high + 1) // 2
        if json_size(marker(mid)) <= max_bytes:
            low = mid
        else:
            high = mid - 1
    return marker(low)


def truncation_marker(omitted_chars: int) -> str:
    """What `limit_text` appends in place of the characters it drops."""
    return f"\n… [truncated: {omitted_chars} more characters]"


def limit_text(text: str, max_chars: int) -> str:
    """The first `max_chars` characters of `text`, plus a marker saying how many were cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + truncation_marker(len(text) - max_chars)
