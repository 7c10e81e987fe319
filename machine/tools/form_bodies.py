"""Request bodies as an OpenAPI operation declares them: JSON, a form
(`application/x-www-form-urlencoded`), or `multipart/form-data`.

A form's fields are encoded the way the document's `encoding` says (OpenAPI 3's
serialization rules): `style: deepObject` (Stripe declares it for every nested field) nests
with brackets, `address[city]=Berlin`, and lists by index, `items[0][price]=p_1`, the form
Stripe and Rails read; the default style, `form` exploded, sends a list as the key repeated and
an object's properties as keys of their own. Written here because neither httpx2 nor any
library at hand encodes OpenAPI's styles (httpx2 sends a flat mapping only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
#: The media types a body is sent as, in the order one is chosen when several are offered.
SENDABLE = (JSON, FORM, MULTIPART)


@dataclass(frozen=True)
class BodyEncoding:
    """How an operation's body is sent: its media type, and each form field's style."""

    media: str = JSON
    deep: frozenset[str] = field(default_factory=frozenset)
    #: Fields sent as a file (`format: binary` in a multipart body's schema).
    files: frozenset[str] = field(default_factory=frozenset)


def chosen_media(content: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The media type (and its object) a body is sent as: JSON first (any `+json` type),
    then a form, then multipart; None when the operation offers none of them."""
    jsonish = [m for m in content if m == JSON or (m.startswith("application/") and "json" in m)]
    for media in [*jsonish, FORM, MULTIPART]:
        found = content.get(media)
        if isinstance(found, Mapping):
            return media, found
    return None


def encoding_of(media: str, media_object: Mapping[str, Any], schema: Any) -> BodyEncoding:
    if media not in (FORM, MULTIPART):
        return BodyEncoding(JSON if media == JSON else media)
    declared = media_object.get("encoding")
    styles = declared if isinstance(declared, Mapping) else {}
    deep = frozenset(
        name
        for name, how in styles.items()
        if isinstance(how, Mapping) and how.get("style") == "deepObject"
    )
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    files = frozenset(
        name
        for name, prop in (properties or {}).items()
        if isinstance(prop, Mapping) and prop.get("format") == "binary"
    )
    return BodyEncoding(media, deep, files if media == MULTIPART else frozenset())


def _scalar(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


def _flat(value: JsonValue) -> str:
    """A value in one form field: a scalar as text, anything nested as JSON."""
    return json.dumps(value) if isinstance(value, dict | list) else _scalar(value)


def _deep(key: str, value: JsonValue, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for name, inner in value.items():
            _deep(f"{key}[{name}]", inner, out)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            _deep(f"{key}[{index}]", inner, out)
    else:
        out.append((key, _scalar(value)))


def form_fields(body: JsonValue, encoding: BodyEncoding) -> list[tuple[str, str]]:
    """The body's fields, in order, as (key, value) pairs of a form."""
    out: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        return out
    for name, value in body.items():
        if name in encoding.deep:
            _deep(name, value, out)
        elif isinstance(value, list):
            out.extend((name, _flat(v)) for v in value)
        elif isinstance(value, dict):  # `form` exploded: each property a key of its own
            out.extend((inner, _flat(v)) for inner, v in value.items())
        else:
            out.append((name, _scalar(value)))
    return out


def multipart_parts(
    body: JsonValue, encoding: BodyEncoding
) -> list[tuple[str, tuple[str | None, bytes, str]]]:
    """The body as multipart parts: a file field as a file (its text's bytes), an object or
    list as a JSON part, anything else as a text field."""
    parts: list[tuple[str, tuple[str | None, bytes, str]]] = []
    if not isinstance(body, dict):
        return parts
    for name, value in body.items():
        if name in encoding.files:
            data = value.encode() if isinstance(value, str) else json.dumps(value).encode()
            parts.append((name, (name, data, "application/octet-stream")))
        elif isinstance(value, dict | list):
            parts.append((name, (None, json.dumps(value).encode(), JSON)))
        else:
            parts.append((name, (None, _scalar(value).encode(), "text/plain")))
    return parts
