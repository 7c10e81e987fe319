"""Bearer API keys in front of /mcp: who is calling.

A missing or unknown key gets 401 with `WWW-Authenticate` (a session id of another principal
gets 403 from the session gate). Errors are JSON-RPC error bodies so MCP clients report them
as such. The principal is handed to the tool handlers through `current_principal`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any

import anyio
import limits
import limits.storage
import limits.strategies
from anyio import to_thread

from lockgate.server.keys import ApiKeys

log = logging.getLogger("lockgate.auth")

#: Key rechecks under way (`BearerAuth._while_key_valid`), referred to until they end.
_RECHECKS: set[asyncio.Task[None]] = set()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: JSON-RPC codes of the HTTP-level refusals (implementation-defined range).
UNAUTHORIZED = -32004
#: A per-principal bound was reached (request rate, sessions): retry later or use less.
OVER_LIMIT = -32005

current_principal: ContextVar[str] = ContextVar("lockgate_principal")
#: The API key the request came with (approval links minted in it die with that key).
current_key_id: ContextVar[str | None] = ContextVar("lockgate_key_id", default=None)


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


def without_header(scope: Scope, unwanted: bytes) -> Scope:
    """A copy of `scope` without the header `unwanted` (the ASGI scope is the request's)."""
    headers = [(n, v) for n, v in scope.get("headers", []) if n != unwanted]
    return {**scope, "headers": headers}


class RequestRate:
    """Requests per minute each principal may send to this instance (a sliding window)."""

    def __init__(self, per_minute: int) -> None:
        self.item = limits.RateLimitItemPerMinute(per_minute)
        self._limiter = limits.strategies.SlidingWindowCounterRateLimiter(
            limits.storage.MemoryStorage()
        )

    def admit(self, principal: str) -> float | None:
        """None if the request may go on, else the seconds to wait before retrying."""
        if self._limiter.hit(self.item, principal):
            return None
        reset = self._limiter.get_window_stats(self.item, principal).reset_time
        return max(1.0, reset - time.time())


class BearerAuth:
    """Who is calling, how often, and for how long.

    A stream (SSE, long-lived) outlives the check made when it opened: the key is checked
    again every `recheck_secs` while the request runs, and a revoked key's request is cut
    off there and then; nothing more reaches the client on it.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: ApiKeys,
        *,
        rate: RequestRate | None = None,
        recheck_secs: float = 5.0,
    ) -> None:
        self.app, self.keys, self.rate, self.recheck_secs = app, keys, rate, recheck_secs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        identity = await to_thread.run_sync(self.keys.identify, token) if token else None
        if token is None or identity is None:
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
        principal = identity.principal_id
        wait = self.rate.admit(principal) if self.rate is not None else None
        if wait is not None:
            await json_rpc_error(
                send,
                429,
                OVER_LIMIT,
                f"Too many requests: this API key's principal sent more than "
                f"{self.rate.item.amount if self.rate else 0} requests in a minute, the limit "
                f"(LOCKGATE_MAX_REQUESTS_PER_MINUTE). Retry in {wait:.0f} s.",
                ((b"retry-after", str(round(wait)).encode()),),
            )
            return
        scope.setdefault("state", {})["principal"] = principal
        principal_var = current_principal.set(principal)
        key_var = current_key_id.set(identity.key_id)
        try:
            await self._while_key_valid(scope, receive, send, token)
        finally:
            current_key_id.reset(key_var)
            current_principal.reset(principal_var)

    async def _while_key_valid(
        self, scope: Scope, receive: Receive, send: Send, token: str
    ) -> None:
        revoked = False
        started = finished = False

        async def guarded_send(message: Message) -> None:
            nonlocal started, finished
            if revoked:
                return  # the key was revoked: not one more byte for this request
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        # The key is checked again every `recheck_secs` while the request runs, from a
        # timer on the loop, not from a task waiting beside each request: a task group and
        # its task cost about 80 us of the event loop a request, and most requests end long
        # before the first recheck is due.
        loop = asyncio.get_running_loop()
        over = False
        timer: asyncio.TimerHandle | None = None
        with anyio.CancelScope() as request:

            async def recheck() -> None:
                nonlocal revoked, timer
                try:
                    valid = await to_thread.run_sync(self.keys.identify, token) is not None
                except Exception:  # the store failed: the key was valid, check again later
                    log.warning("could not check an open request's API key", exc_info=True)
                    valid = True
                if over:
                    return  # the request ended during the check
                if valid:
                    timer = loop.call_later(self.recheck_secs, recheck_due)
                    return
                revoked = True
                log.info("API key revoked: ending its open request")
                request.cancel()

            def recheck_due() -> None:
                checking = loop.create_task(recheck())
                _RECHECKS.add(checking)  # a task the loop only refers to weakly
                checking.add_done_callback(_RECHECKS.discard)

            timer = loop.call_later(self.recheck_secs, recheck_due)
            try:
                await self.app(scope, receive, guarded_send)
            finally:
                over = True
                timer.cancel()
        if revoked and not finished:
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await json_rpc_error(
                    send, 401, UNAUTHORIZED, "The API key was revoked while this request ran."
                )
