"""A loopback proxy that adds an API key to every request it forwards.

The official conformance suite sends no Authorization header, and Lockgate answers nothing
without a key. The proxy stands between them and changes nothing else: method, path, query,
Host, Origin and every other header go through as sent (so the suite's Host and Origin
checks reach the server), and each answer streams back as it arrives (SSE included), its
status and headers kept. Written by hand because no library here forwards a request with
one header added and the rest untouched; it is a test fixture, never part of the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import httpx2
from anyio import to_thread
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.support.asgi_thread import serve_in_thread

#: Hop-by-hop headers (RFC 9110 §7.6.1) and the length the forwarding recomputes.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "content-length",
    # Set again by the proxy's own server.
    "date",
    "server",
}


#: Called with each request's body before it is forwarded (in a worker thread: it may
#: block, say to SIGKILL and restart the server behind the proxy).
BeforeForward = Callable[[bytes], None]


def _app(upstream: str, key: str, before: BeforeForward | None) -> Starlette:
    async def forward(request: Request) -> StreamingResponse:
        content = await request.body()
        if before is not None:
            await to_thread.run_sync(before, content)
        # A client per request, closed with its answer: nothing is left open at the end.
        client = httpx2.AsyncClient(base_url=upstream, timeout=httpx2.Timeout(None))
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
        headers.append(("authorization", f"Bearer {key}"))
        sent = client.build_request(
            request.method,
            request.url.path,
            params=request.url.query,
            headers=headers,
            content=content,
        )
        try:
            answer = await client.send(sent, stream=True)
        except BaseException:
            await client.aclose()
            raise

        async def close() -> None:
            await answer.aclose()
            await client.aclose()

        async def body() -> AsyncIterator[bytes]:
            async for chunk in answer.aiter_raw():
                yield chunk

        return StreamingResponse(
            body(),
            status_code=answer.status_code,
            headers={k: v for k, v in answer.headers.items() if k.lower() not in _HOP},
            background=BackgroundTask(close),
        )

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


@contextmanager
def key_proxy(upstream: str, key: str, before: BeforeForward | None = None) -> Iterator[str]:
    """A proxy to `upstream` (a base URL) adding `key`, on loopback; yields its base URL.
    `before` sees each request's body first."""
    serving = serve_in_thread(_app(upstream, key, before), "key proxy")
    port = next(serving)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serving.close()
