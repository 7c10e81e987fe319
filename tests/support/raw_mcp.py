"""Hand-built MCP-over-HTTP requests, for what a well-behaved client never sends.

`RawMCP` posts JSON-RPC to /mcp itself, in either protocol era, so a test can send a bad
body, a wrong header or an oversized request and see the status code and body the SDK
client would hide; `rpc_body` reads the JSON-RPC message back whether it came as JSON or
as an SSE event.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def rpc_body(response: httpx2.Response) -> Any:
    """The JSON-RPC message of a response, whether sent as JSON or as an SSE event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [
            line[len("data:") :].strip()
            for line in response.text.splitlines()
            if line.startswith("data:") and line[len("data:") :].strip()
        ]
        assert data, f"no SSE data event in {response.text!r}"
        return json.loads(data[-1])
    return response.json()


class RawMCP:
    """Hand-built JSON-RPC POSTs to /mcp, in either protocol era.

    Legacy: one `initialize` (its session id is reused); modern: the `_meta` and the
    `Mcp-Method`/`Mcp-Name` headers the 2026-07-28 protocol requires.
    """

    def __init__(self, http: httpx2.Client, url: str, key: str | None, mode: str) -> None:
        self.http, self.url, self.mode = http, url, mode
        self.auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self.session_id: str | None = None
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def initialize(
        self, capabilities: dict[str, Any] | None = None, name: str = "raw-test"
    ) -> httpx2.Response:
        """Open a 2025-11-25 session declaring `capabilities` (none by default), and send
        `notifications/initialized` on it."""
        response = self.http.post(
            self.url,
            headers={**self.auth, **ACCEPT},
            json={
                "jsonrpc": "2.0",
                "id": self.next_id(),
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": capabilities or {},
                    "clientInfo": {"name": name, "version": "1"},
                },
            },
        )
        if response.status_code == 200:
            self.session_id = response.headers["mcp-session-id"]
            done = self.http.post(
                self.url,
                headers=self.headers("notifications/initialized"),
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            )
            assert done.status_code == 202, done.text
        return response

    def headers(self, method: str, name: str | None = None) -> dict[str, str]:
        headers = {**self.auth, **ACCEPT}
        if self.mode == MODERN:
            headers.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": method})
            if name is not None:
                headers["Mcp-Name"] = name
        else:
            if self.session_id is None and method != "initialize":
                self.initialize()
            if self.session_id is not None:
                headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = "2025-11-25"
        return headers

    def request(self, method: str, params: dict[str, Any] | None = None) -> httpx2.Response:
        params = dict(params or {})
        if self.mode == MODERN:
            params["_meta"] = MODERN_META
        name = params.get("name") if method == "tools/call" else None
        return self.http.post(
            self.url,
            headers=self.headers(method, name),
            json={"jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": params},
        )

    def call_tool(self, name: str, arguments: Any) -> httpx2.Response:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def post_raw(self, content: bytes, method: str = "tools/list") -> httpx2.Response:
        return self.http.post(self.url, headers=self.headers(method), content=content)
