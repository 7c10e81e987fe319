"""One persistent 2025 session over raw HTTP, as a client keeps one across restarts.

The ledger's scenarios need the wire itself, which the official client hides: the session's
POSTs and the SSE events that answer them, its collecting GET with `Last-Event-ID` (which
acknowledges the reports read before), its DELETE, and what it received
(`simulation.inbox.Inbox`, shared with the `RemoteClient` it belongs to).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2

from lockgate.machine.ledger import acknowledged_reports
from lockgate.simulation.inbox import Inbox
from lockgate.simulation.real_process import ProcessKilled
from lockgate.simulation.remote_client import RemoteClient, died
from lockgate.simulation.world import ScenarioFailed

PROTOCOL = "2025-11-25"


class SessionClient:
    """A 2025 session over raw HTTP, as a client keeps one across restarts."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self.session_id: str | None = None

    @property
    def inbox(self) -> Inbox:
        return self.client.inbox

    def _headers(self, accept: str = "application/json, text/event-stream") -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.client.deployment.key}",
            "Accept": accept,
            "MCP-Protocol-Version": PROTOCOL,
        }
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    def _guard(self, work: Callable[[], Any]) -> Any:
        server = self.client.server
        try:
            return work()
        except httpx2.TransportError as exc:
            if died(server):
                raise ProcessKilled(
                    f"{server.name} died ({server.proc.returncode})", server
                ) from exc
            raise

    def open(self) -> str:
        def initialize() -> str:
            message = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "sim", "version": "1"},
                },
            }
            url = f"{self.client.server.url}/mcp"
            opened = httpx2.post(url, headers=self._headers(), json=message, timeout=30)
            opened.raise_for_status()
            self.session_id = opened.headers["mcp-session-id"]
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            httpx2.post(url, headers=self._headers(), json=note, timeout=30)
            return self.session_id

        opened: str = self._guard(initialize)
        return opened

    def call(self, request_id: str, code: str) -> dict[str, Any]:
        """tools/call `execute` on the session; the answer (or -32010) for `request_id`."""
        self.inbox.sent(request_id)
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": code}},
        }

        def post() -> dict[str, Any]:
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream("POST", url, headers=self._headers(), json=message, timeout=90) as r:
                if r.status_code == 404:
                    # An answer too: the SDKs reject the pending call with it. (A POST that
                    # passed the gate as a DELETE closed the session is answered 404 by the
                    # terminated transport, and the ledger counts that id answered.)
                    self.inbox.answer(request_id)
                    raise SessionGone()
                for event_id, data in _events(r):
                    if isinstance(data, dict) and data.get("id") == request_id:
                        return self._received(event_id, data)
            raise ScenarioFailed(f"the stream of {request_id} ended without its answer")

        answer: dict[str, Any] = self._guard(post)
        return answer

    def set_log_level(self, request_id: str, level: str) -> dict[str, Any]:
        """logging/setLevel on the session; its answer (or -32010) for `request_id`."""
        self.inbox.sent(request_id)
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "logging/setLevel",
            "params": {"level": level},
        }

        def post() -> dict[str, Any]:
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream("POST", url, headers=self._headers(), json=message, timeout=30) as r:
                for event_id, data in _events(r):
                    if isinstance(data, dict) and data.get("id") == request_id:
                        return self._received(event_id, data)
            raise ScenarioFailed(f"the stream of {request_id} ended without its answer")

        answer: dict[str, Any] = self._guard(post)
        return answer

    def _received(self, event_id: str | None, data: dict[str, Any]) -> dict[str, Any]:
        if "error" in data and data["error"].get("code") == -32010:
            acked = acknowledged_reports(event_id)
            self.inbox.lost(acked[1][-1] if acked else "", data)
        else:
            self.inbox.answer(str(data.get("id")))
        return data

    def drop(self, request_id: str, *, sent: bool = True) -> None:
        """tools/call with code that runs a while; the client goes away after the first
        bytes of the stream (its priming event). `sent`: the client counts the request as
        its own (it then expects its -32010)."""
        if sent:
            self.inbox.sent(request_id)
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": compute_code(3_000_000)}},
        }

        def abandon() -> None:
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream("POST", url, headers=self._headers(), json=message, timeout=30) as r:
                for _ in r.iter_bytes():
                    break

        self._guard(abandon)

    def collect(self) -> None:
        """The collecting GET: acknowledges what it read last, reads the reports written."""

        def get() -> None:
            headers = self._headers("text/event-stream")
            if self.inbox.last_event_id is not None:
                headers["Last-Event-ID"] = self.inbox.last_event_id
                acked = acknowledged_reports(self.inbox.last_event_id)
                if acked is not None:
                    self.inbox.acknowledged.update(acked[1])
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream(
                "GET", url, headers=headers, timeout=httpx2.Timeout(30, read=3)
            ) as r:
                if r.status_code != 200:
                    return
                try:
                    for event_id, data in _events(r):
                        if isinstance(data, dict) and "error" in data:
                            self._received(event_id, data)
                            self.inbox.last_event_id = event_id
                except httpx2.ReadTimeout:
                    return  # the listening stream: nothing (more) to report

        self._guard(get)

    def close(self) -> int:
        def delete() -> int:
            url = f"{self.client.server.url}/mcp"
            return httpx2.delete(url, headers=self._headers(), timeout=30).status_code

        status: int = self._guard(delete)
        return status


class SessionGone(Exception):
    """The session's requests are answered 404: it expired or was closed."""


def _events(response: httpx2.Response) -> Any:
    """(event id, parsed data) for each SSE event of a streamed response (or the JSON body)."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        body = response.read()
        if body.strip():
            yield None, json.loads(body)
        return
    event_id: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "":
            text = "\n".join(data).strip()
            if text:  # a priming event has an id and no data
                yield event_id, json.loads(text)
            event_id, data = None, []


def compute_code(iterations: int) -> str:
    """Pure code that runs a while (a request to drop, or to keep in flight)."""
    return f"total = 0\nfor i in range({iterations}):\n    total = total + i\ntotal"
