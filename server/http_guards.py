"""ASGI guards in front of every route: bounded request bodies and the Host allowlist.

- **Body limit, while reading.** A body is read up to the limit and no further: a declared
  Content-Length over it is refused before a byte is read, and a chunked body is cut off at
  the first chunk that crosses it. Hand-written rather than the SDK's
  `RequestBodyLimitMiddleware` (same reading strategy) because its 413 is plain text, and
  ours must be an error a client and a model can read: a JSON-RPC error on /mcp, a JSON
  problem elsewhere.
- **Host allowlist (DNS rebinding).** The approval page and API accept the same Host and
  Origin values as /mcp, checked by the SDK's own `TransportSecurityMiddleware`; a rebinding
  page that reaches the server under another name gets 421.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request

from lockgate.machine.settings import Settings
from lockgate.server.auth import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """The Host and Origin values this server answers to: loopback, the configured extra
    hosts, and the host of its public URL (approval links point there)."""
    hosts = [h.strip() for h in settings.allowed_hosts.split(",") if h.strip()]
    if settings.public_url:
        netloc = settings.public_url.split("://", 1)[-1].split("/", 1)[0]
        hosts.append(netloc)
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("https", "http")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*LOOPBACK_HOSTS, *hosts],
        allowed_origins=[*LOOPBACK_ORIGINS, *origins],
    )


async def _json(
    send: Send, status: int, body: object, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _is_mcp(scope: Scope) -> bool:
    return str(scope.get("path", "")).rstrip("/") == "/mcp"


async def refuse(
    scope: Scope, send: Send, status: int, code: str, rpc_code: int, message: str
) -> None:
    """One refusal, in the shape the route's clients read."""
    if _is_mcp(scope):
        body: object = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": rpc_code, "message": message},
        }
    else:
        body = {"error": {"code": code, "message": message}}
    await _json(send, status, body, [(b"cache-control", b"no-store")])


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await refuse(
            scope,
            send,
            413,
            "invalid_input",
            -32600,
            f"The request body is larger than {self.max_bytes} bytes, this server's limit "
            "(LOCKGATE_MAX_REQUEST_BYTES). Send a smaller request.",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, send)
            return
        body = bytearray()
        complete = False
        trailing: Message | None = None
        while not complete:
            message = await receive()
            if message["type"] != "http.request":
                trailing = message  # the client went away mid-body
                break
            body.extend(message.get("body", b""))
            if len(body) > self.max_bytes:
                await self._too_large(scope, send)
                return
            complete = not message.get("more_body", False)
        queued: deque[Message] = deque(
            [{"type": "http.request", "body": bytes(body), "more_body": not complete}]
        )
        if trailing is not None:
            queued.append(trailing)

        async def replay() -> Message:
            return queued.popleft() if queued else await receive()

        await self.app(scope, replay, send)


class HostAllowlist:
    """The SDK's Host/Origin check, applied to the routes under `prefixes`."""

    def __init__(
        self, app: ASGIApp, security: TransportSecuritySettings, prefixes: Sequence[str]
    ) -> None:
        self.app, self.prefixes = app, tuple(prefixes)
        self.check = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(self.prefixes):
            refused = await self.check.validate_request(Request(scope, receive), is_post=False)
            if refused is not None:
                what = "Host" if refused.status_code == 421 else "Origin"
                await refuse(
                    scope,
                    send,
                    refused.status_code,
                    "forbidden",
                    -32600,
                    f"This server does not answer to this {what} header. Use the address it "
                    "is configured with (LOCKGATE_PUBLIC_URL, LOCKGATE_ALLOWED_HOSTS).",
                )
                return
        await self.app(scope, receive, send)
