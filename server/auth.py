"""Bearer API keys in front of /mcp: who is calling.

A missing or unknown key gets 401 with `WWW-Authenticate` (a session id of another principal
gets 403 from the session gate). Errors are JSON-RPC error bodies so MCP clients report them
as such. The principal is handed to the tool handlers through `current_principal`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any

from anyio import to_thread

from server.keys import ApiKeys

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: JSON-RPC codes of the HTTP-level refusals (implementation-defined range).
UNAUTHORIZED = -32004
FORBIDDEN_SESSION = -32003

current_principal: ContextVar[str] = ContextVar("lockgate_principal")


async def json_rpc_error(
    send: Send,
    status: int,
    code: int,
    message: str,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})


def bearer_token(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


class BearerAuth:
    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        principal = await to_thread.run_sync(self.keys.authenticate, token) if token else None
        if principal is None:
            reason = "invalid_token" if token else "invalid_request"
            await json_rpc_error(
                send,
                401,
                UNAUTHORIZED,
                "Authentication required: send 'Authorization: Bearer <API key>' "
                "(create one with `lockgate keys create`)."
                if not token
                else "The API key is not valid (unknown or revoked).",
                ((b"www-authenticate", f'Bearer realm="lockgate", error="{reason}"'.encode()),),
            )
            return
        scope.setdefault("state", {})["principal"] = principal
        token_var = current_principal.set(principal)

        try:
            await self.app(scope, receive, send)
        finally:
            current_principal.reset(token_var)
