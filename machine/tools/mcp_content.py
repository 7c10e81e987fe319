"""What agent code gets of an upstream MCP tool's answer, and what a failure says.

An answer of text only is its text, the parts joined by newlines (a string, as it always
was); an answer with structured content is that content. An answer with any other part (an
image, a sound, an embedded resource, a link to a resource) is a list of its parts in order,
each a dict naming its `type`:

- `{"type": "text", "text": ...}`
- `{"type": "image" | "audio", "mime_type": ..., "data": <base64 text>}`
- `{"type": "resource", "uri": ..., "mime_type": ..., "text": ...}` (or `"blob"`: base64)
- `{"type": "resource_link", "uri": ..., "name": ..., "title": ..., "description": ...,
  "mime_type": ...}` (None where the upstream gave none)

An answer is bounded like an HTTP tool's response (LOCKGATE_HTTP_MAX_RESPONSE_BYTES): a
larger one is refused in words, never kept.
"""

from __future__ import annotations

from mcp import types
from pydantic import JsonValue

from lockgate.machine.tools.errors import ToolFailed
from lockgate.machine.values import json_size

#: The setting that bounds an upstream tool's answer (the one HTTP tools' responses use).
SIZE_SETTING = "LOCKGATE_HTTP_MAX_RESPONSE_BYTES"


def part_of(content: types.ContentBlock) -> dict[str, JsonValue]:
    """One part of an answer as agent code gets it."""
    if isinstance(content, types.TextContent):
        return {"type": "text", "text": content.text}
    if isinstance(content, types.ImageContent | types.AudioContent):
        return {"type": content.type, "mime_type": content.mime_type, "data": content.data}
    if isinstance(content, types.EmbeddedResource):
        held = content.resource
        body: dict[str, JsonValue] = (
            {"text": held.text}
            if isinstance(held, types.TextResourceContents)
            else {"blob": held.blob}
        )
        return {"type": "resource", "uri": str(held.uri), "mime_type": held.mime_type, **body}
    return {
        "type": "resource_link",
        "uri": str(content.uri),
        "name": content.name,
        "title": content.title,
        "description": content.description,
        "mime_type": content.mime_type,
    }


def failure_text(result: types.CallToolResult) -> str:
    """What a failed call says: its text parts (other parts cannot be words)."""
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return "\n".join(texts) or "no message"


def answer_of(result: types.CallToolResult, tool: str, max_bytes: int) -> JsonValue:
    """The value agent code gets for a successful call to the upstream tool `tool`; a
    `ToolFailed` for one larger than `max_bytes`."""
    answer: JsonValue
    if result.structured_content is not None:
        answer = result.structured_content
    elif all(isinstance(c, types.TextContent) for c in result.content):
        answer = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
    else:
        answer = [part_of(c) for c in result.content]
    size = json_size(answer)
    if size > max_bytes:
        raise ToolFailed(
            f"the upstream tool {tool!r} answered {size} bytes, more than {max_bytes} "
            f"({SIZE_SETTING}); ask it for less (a smaller image, a page of the resource)"
        )
    return answer
