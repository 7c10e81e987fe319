"""An upstream MCP server that dies, for the MCP source's tests of lost connections (and
of content other than text): `python -m tests.support.upstream_mcp_faults EFFECTS_FILE`.

Each effect is a line of JSON appended to EFFECTS_FILE naming the process that made it, so a
test sees which upstream process (the first, or one started again) made it. Two tools end
their own process in the middle of a call, after recording that they ran and before they
answer: the connection closes with the call's outcome unknown to the caller."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

from mcp.server import MCPServer
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

server = MCPServer("upstream-faults", log_level="WARNING")
EFFECTS = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.devnull)
#: The bytes of the "image" the media tools answer (any bytes will do: they travel as base64).
PIXELS = bytes(range(256)) * 4


def record(effect: dict[str, object]) -> None:
    with EFFECTS.open("a") as out:
        out.write(json.dumps({**effect, "pid": os.getpid()}) + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pid() -> int:
    """This process's id (a test kills it while a write waits for approval)."""
    return os.getpid()


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete_thing(thing_id: int) -> str:
    """Delete a thing for good (recorded with this process's id)."""
    record({"deleted": thing_id})
    return f"deleted {thing_id}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete_and_die(thing_id: int) -> str:
    """Delete a thing, then end this process before answering."""
    record({"deleted": thing_id})
    os._exit(1)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def look_and_die(key: str) -> str:
    """A read that ends this process before answering."""
    record({"looked": key})
    os._exit(1)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def media() -> list[TextContent | ImageContent | AudioContent | EmbeddedResource | ResourceLink]:
    """Text, an image, a sound, two embedded resources and a link to a resource."""
    data = base64.b64encode(PIXELS).decode()
    return [
        TextContent(type="text", text="a caption"),
        ImageContent(type="image", data=data, mime_type="image/png"),
        AudioContent(type="audio", data=data, mime_type="audio/wav"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="file:///notes/a.txt", mime_type="text/plain", text="hi"
            ),
        ),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri="file:///blobs/b.bin", mime_type="application/octet-stream", blob=data
            ),
        ),
        ResourceLink(
            type="resource_link", uri="file:///big/c.csv", name="c.csv", mime_type="text/csv"
        ),
    ]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def two_texts() -> list[TextContent]:
    """Two text parts (joined, as any text-only answer)."""
    return [TextContent(type="text", text="one"), TextContent(type="text", text="two")]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def big_image(size: int) -> ImageContent:
    """An image of `size` bytes."""
    return ImageContent(
        type="image", data=base64.b64encode(b"\0" * size).decode(), mime_type="image/png"
    )


if __name__ == "__main__":
    server.run()
