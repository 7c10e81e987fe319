"""An upstream MCP server that dies, for the MCP source's tests of lost connections:
`python -m tests.support.upstream_mcp_faults EFFECTS_FILE`.

Each effect is a line of JSON appended to EFFECTS_FILE naming the process that made it, so a
test sees which upstream process (the first, or one started again) made it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("upstream-faults", log_level="WARNING")
EFFECTS = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.devnull)


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


if __name__ == "__main__":
    server.run()
