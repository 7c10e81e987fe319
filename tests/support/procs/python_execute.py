"""One `execute` through the official Python SDK client (`mcp`) on a 2025 session, in its
own process, speaking the protocol version it is told to:

    python -m tests.support.procs.python_execute <server url> <api key> <version> <code>

Prints one JSON line: `{"answer": <structuredContent>}` or `{"error": {code, message, data},
"seconds": ...}`. With `version` other than the SDK's newest, the client offers that version
in `initialize` (the SDK negotiates whatever its handshake constant says; everything after,
its reconnection with Last-Event-ID included, is the SDK's own code). It runs in a process
of its own because that constant is the module's, shared by every client in a process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import mcp.client.session as sdk_session
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def execute(url: str, key: str, code: str) -> dict[str, Any]:
    started = time.monotonic()
    outcome: dict[str, Any] = {}
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    try:
        async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as c:
            outcome["protocolVersion"] = c.protocol_version
            try:
                result = await c.call_tool("execute", {"code": code})
                outcome["answer"] = result.structured_content
            except MCPError as exc:
                error = exc.error
                outcome["error"] = {
                    "code": error.code,
                    "message": error.message,
                    "data": error.data,
                }
                outcome["seconds"] = time.monotonic() - started
    except BaseExceptionGroup:
        # mcp 2.3.0 can fail its own teardown after a server died under one of its streams
        # (tests/support/mcp_calls.py); what the call ended with was kept before that.
        if "answer" not in outcome and "error" not in outcome:
            raise
    return outcome


def main() -> None:
    url, key, version, code = sys.argv[1:5]
    vars(sdk_session)["LATEST_HANDSHAKE_VERSION"] = version  # what `initialize` offers
    outcome = asyncio.run(execute(url, key, code))
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
