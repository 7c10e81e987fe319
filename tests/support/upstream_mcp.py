"""An upstream MCP server for the MCP source's tests, written with the SDK's MCPServer and run
over stdio: `python -m tests.support.upstream_mcp EFFECTS_FILE`. Its destructive tool appends
to EFFECTS_FILE, so a test counts each effect exactly."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("upstream", log_level="WARNING")
EFFECTS = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.devnull)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(key: str) -> dict[str, str]:
    """Look a key up (read-only)."""
    return {"key": key, "value": key.upper()}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete_thing(thing_id: int) -> str:
    """Delete a thing for good."""
    with EFFECTS.open("a") as out:
        out.write(json.dumps({"deleted": thing_id}) + "\n")
    return f"deleted {thing_id}"


@server.tool(name="plain-tool")
def plain(x: int) -> int:
    """A tool with no annotations."""
    return x * 2


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail() -> str:
    """Always fails."""
    raise ToolError("the upstream refuses")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pid() -> int:
    """This process's id (a test kills it to see the source connect again)."""
    return os.getpid()


if __name__ == "__main__":
    server.run()
