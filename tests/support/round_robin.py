"""A round-robin HTTP proxy in front of several `lockgate serve` instances, as a load balancer
without session affinity would be: every request goes to the next instance, so a session
moves between instances on every request. A connection refused (an instance that is down)
passes the request to the next one; a response cut off by an instance's death simply ends,
as it would behind a real balancer. Responses are streamed through (SSE included)."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field

import httpx2

from tests.support.asgi_thread import serve_in_thread

#: Headers that describe one hop, never forwarded.
HOP = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade"}
)


@dataclass
class RoundRobin:
    backends: list[str]
    #: Requests each backend answered (a test checks the load was really spread).
    served: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._next = itertools.cycle(range(len(self.backends)))
        self._lock = threading.Lock()

    def _order(self) -> list[str]:
        with self._lock:
            first = next(self._next)
        return self.backends[first:] + self.backends[:first]

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def,type-arg]
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body.extend(message.get("body", b""))
            if not message.get("more_body", False):
                break
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP]
        query = scope.get("query_string", b"").decode()
        path = scope["path"] + (f"?{query}" if query else "")
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(120.0, connect=2.0)) as client:
            for backend in self._order():
                request = client.build_request(
                    scope["method"], backend + path, headers=headers, content=bytes(body)
                )
                try:
                    response = await client.send(request, stream=True)
                except httpx2.ConnectError:
                    continue  # that instance is down: the next one takes the request
                except httpx2.TransportError:
                    # It died with the request: a balancer answers 502 (never sending a
                    # request that may have been taken to another instance).
                    await send({"type": "http.response.start", "status": 502, "headers": []})
                    await send({"type": "http.response.body", "body": b"the instance died"})
                    return
                self.served[backend] += 1
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [
                            (k, v) for k, v in response.headers.raw if k.lower() not in HOP
                        ],
                    }
                )
                try:
                    async for chunk in response.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except httpx2.HTTPError:
                    pass  # the instance died mid-response: the response ends here
                finally:
                    await response.aclose()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"no instance is up"})


@dataclass
class RunningProxy:
    proxy: RoundRobin
    base_url: str

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp"


def serve_proxy(backends: list[str], port: int | None = None) -> Generator[RunningProxy]:
    """Serve a round-robin proxy over `backends` (base URLs) until the generator closes, on
    `port` (the public URL the instances were told) or a free one."""
    proxy = RoundRobin(backends)
    for bound in serve_in_thread(proxy, "round-robin", port):
        yield RunningProxy(proxy, f"http://127.0.0.1:{bound}")
