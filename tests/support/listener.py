"""A loopback HTTP listener the reach tests point principals' sources at: it stands in for the
attacker's host (it records everything it receives: method, path, query, headers, body) and
for an internal service (bound to another loopback address, something only the server's
own network should reach).

It serves an OpenAPI document of its own (`document`), an OAuth token endpoint that hands
out a token to anyone (`/token`), a redirect to anywhere (`/hop?to=...`), an endpoint that
answers one byte at a time, as slowly as asked (`/drip`), an MCP endpoint that never
answers until the test lets it (`/mcp`), recording when a connection to it is given up, and
a webhook receiver (`/hook`) that holds one principal's events as long.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from lockgate.simulation.ports import free_port


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        headers = "\n".join(f"{k}: {v}" for k, v in self.headers.items())
        return f"{self.method} {self.path}?{self.query}\n{headers}\n{self.body!r}"


@dataclass
class Listener:
    host: str = "127.0.0.1"
    port: int = 0
    received: list[Received] = field(default_factory=list)
    #: Bytes /drip sent before its client went away (or all of them).
    dripped: list[int] = field(default_factory=list)
    #: Set while /mcp holds a request; cleared once the client gave the connection up.
    holding: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    given_up: threading.Event = field(default_factory=threading.Event)
    #: Webhook events received at /hook (their bodies), in the order they arrived.
    events: list[dict[str, Any]] = field(default_factory=list)
    #: /hook holds the events whose body names this principal until `released`.
    slow_for: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def saw(self, needle: str) -> bool:
        """Whether anything received carried `needle` (in the path, query, headers or body)."""
        return any(needle in r.text() for r in self.received)

    def document(self, base_url: str | None = None) -> dict[str, Any]:
        """An OpenAPI document of its operations, its server `base_url` (default: itself)."""
        item = {"type": "object", "properties": {"name": {"type": "string"}}}
        return {
            "openapi": "3.1.0",
            "info": {"title": "listener", "version": "1"},
            "servers": [{"url": base_url or self.url}],
            "paths": {
                "/items": {
                    "get": {
                        "operationId": "list_items",
                        "responses": {"200": {"description": "ok"}},
                    },
                    "post": {
                        "operationId": "create_item",
                        "requestBody": {
                            "required": True,
                            "content": {"application/json": {"schema": item}},
                        },
                        "responses": {"200": {"description": "ok"}},
                    },
                },
                "/hop": {
                    "get": {
                        "operationId": "hop",
                        "parameters": [
                            {
                                "name": "to",
                                "in": "query",
                                "required": True,
                                "schema": {"type": "string"},
                            }
                        ],
                        "responses": {"200": {"description": "ok"}},
                    }
                },
                "/drip": {
                    "get": {"operationId": "drip", "responses": {"200": {"description": "ok"}}}
                },
            },
        }

    def app(self) -> Starlette:
        async def record(request: Request) -> Received:
            seen = Received(
                request.method,
                request.url.path,
                request.url.query,
                dict(request.headers),
                await request.body(),
            )
            self.received.append(seen)
            return seen

        async def anything(request: Request) -> Response:
            await record(request)
            return JSONResponse({"ok": True, "path": request.url.path})

        async def token(request: Request) -> Response:
            await record(request)
            return JSONResponse({"access_token": "listener-token", "expires_in": 3600})

        async def hop(request: Request) -> Response:
            await record(request)
            return RedirectResponse(request.query_params.get("to", "/"), status_code=302)

        async def drip(request: Request) -> Response:
            await record(request)
            total = int(request.query_params.get("bytes", "40"))
            every = float(request.query_params.get("every", "0.5"))

            async def trickle() -> AsyncIterator[bytes]:
                sent = 0
                try:
                    for _ in range(total):
                        yield b"x"
                        sent += 1
                        await asyncio.sleep(every)  # the slow upstream this endpoint is
                finally:
                    self.dripped.append(sent)

            return StreamingResponse(trickle(), media_type="text/plain")

        async def mcp(request: Request) -> Response:
            await record(request)
            self.holding.set()
            while not self.released.is_set():
                if await request.is_disconnected():
                    self.given_up.set()
                    return Response(status_code=499)
                await asyncio.sleep(0.05)  # polls the test's gate and the client's socket
            return Response(status_code=503)

        async def padded_document(request: Request) -> Response:
            # The listener's document, padded with `pad` bytes of an extension field.
            await record(request)
            padded = {**self.document(), "x-pad": "p" * int(request.query_params.get("pad", "0"))}
            return JSONResponse(padded)

        async def held_document(request: Request) -> Response:
            # A document URL that answers only once the test releases it.
            await record(request)
            self.holding.set()
            while not self.released.is_set():
                if await request.is_disconnected():
                    self.given_up.set()
                    return Response(status_code=499)
                await asyncio.sleep(0.05)  # polls the test's gate and the client's socket
            return JSONResponse(self.document())

        async def hook(request: Request) -> Response:
            seen = await record(request)
            event = json.loads(seen.body)
            if self.slow_for and event["data"]["principal"] == self.slow_for:
                self.holding.set()
                while not self.released.is_set():
                    if await request.is_disconnected():
                        self.given_up.set()
                        return Response(status_code=499)
                    await asyncio.sleep(0.05)  # polls the test's gate and the client's socket
            self.events.append(event)
            return Response(status_code=204)

        return Starlette(
            routes=[
                Route("/hook", hook, methods=["POST"]),
                Route("/token", token, methods=["POST"]),
                Route("/hop", hop, methods=["GET"]),
                Route("/drip", drip, methods=["GET"]),
                Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]),
                Route("/held-document", held_document, methods=["GET"]),
                Route("/padded-document", padded_document, methods=["GET"]),
                Route("/{rest:path}", anything, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )


@contextmanager
def listening(host: str = "127.0.0.1") -> Iterator[Listener]:
    """A `Listener` served on `host` (a free port) until the block ends."""
    listener = Listener(host=host, port=free_port())
    server = uvicorn.Server(
        uvicorn.Config(
            listener.app(), host=host, port=listener.port, log_level="error", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, name=f"listener-{host}", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the listener on {host} did not start")
            thread.join(0.01)  # polls uvicorn's own flag; nothing else signals it
        yield listener
    finally:
        listener.released.set()
        server.should_exit = True
        thread.join(10)
