"""The published peer of case 3: a plain FastMCP server (fastmcp on PyPI) with one trivial
tool, `execute`, that runs nothing and keeps nothing, over streamable HTTP with its defaults.
This is the server behind the figure users quote (the TM Dev Lab comparison: a tools/call of
a trivial tool, 50 concurrent clients).

    python -m bench.fastmcp_server PORT
"""

from __future__ import annotations

import sys

from fastmcp import FastMCP

server = FastMCP("peer")


@server.tool
def execute(code: str) -> str:
    """Answers with the code it was given."""
    return code


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
