"""Before boot recovery ends, /mcp answers 503, except a session's GET, served at once.

A client reconnecting after a restart has two attempts (the SDKs' reconnect), and a 503
spends one; its GET only collects reports (which recover what they describe) or listens.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from typing import Any

from lockgate.server.app import WhenReady
from tests.support.servers import run


def _answer(ready: threading.Event, method: str, session: bool) -> tuple[int, list[str]]:
    reached: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["method"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    headers = [(b"mcp-session-id", b"s1")] if session else []
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers}
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    run(WhenReady(inner, ready)(scope, receive, send))
    return int(sent[0]["status"]), reached


def test_only_a_sessions_get_is_served_before_boot_recovery_ends() -> None:
    booting = threading.Event()
    assert _answer(booting, "GET", session=True) == (200, ["GET"])
    assert _answer(booting, "POST", session=True) == (503, [])
    assert _answer(booting, "GET", session=False) == (503, [])
    assert _answer(booting, "DELETE", session=True) == (503, [])
    booting.set()
    assert _answer(booting, "POST", session=True) == (200, ["POST"])
