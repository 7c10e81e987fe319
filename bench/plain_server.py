"""The peer of case 3: a plain SDK `MCPServer` with one tool, `execute`, that runs nothing
and keeps nothing, served over streamable HTTP as `lockgate serve` is.

    python -m bench.plain_server PORT
"""

from __future__ import annotations

import sys

import anyio
from mcp.server import MCPServer

server = MCPServer("plain", log_level="WARNING")


@server.tool()
def execute(code: str) -> str:
    """Answers with the code it was given."""
    return code


if __name__ == "__main__":
    anyio.run(lambda: server.run_streamable_http_async(port=int(sys.argv[1])))
