"""The tests' one reader of Server-Sent Events, as a client sees them on the wire.

Parsed the way the SSE standard says a client must (fields split at the first colon, one
leading space dropped, `data` lines of one event joined with newlines, CRLF or LF line
ends), so a test reads what a real client would, not what the server happened to write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SseEvent:
    id: str | None
    data: str


def sse_events(text: str) -> list[SseEvent]:
    """Every event with an id or data (comments and empty blocks are not events)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, list[str]] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields.setdefault(name, []).append(value.removeprefix(" "))
        if "id" in fields or "data" in fields:
            events.append(SseEvent(fields.get("id", [None])[-1], "\n".join(fields.get("data", []))))
    return events


def sse_messages(body: bytes | str) -> list[Any]:
    """The JSON-RPC messages in an SSE body (events without data, such as the priming
    event, are skipped)."""
    text = body.decode() if isinstance(body, bytes) else body
    return [json.loads(event.data) for event in sse_events(text) if event.data]
