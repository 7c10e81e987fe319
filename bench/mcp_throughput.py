"""Case 3: MCP `execute` calls per second, and their p50 and p99, at 1, 8 and 32 clients; and
the TM Dev Lab workload (a tools/call of a trivial tool, 50 concurrent clients).

Every side is a real process on loopback, driven by the SDK's own client over streamable
HTTP (2025 sessions, one session per client, each client calling in a loop):

- `lockgate serve` as it starts by default (one worker process per core) on a fresh SQLite
  file, `execute {"code": "1"}`: a durable execution (journal, checkpoint, result) and the
  MCP request's own bookkeeping;
- the floor: a plain SDK `MCPServer` whose `execute` tool runs nothing and keeps nothing
  (`bench/plain_server.py`);
- the published peer at 50 clients: a plain FastMCP server with the same trivial tool
  (`bench/fastmcp_server.py`).

At 8 clients, Lockgate also runs with one worker (what the workers bring), with one worker on
the standard library's event loop and h11 (what uvloop and httptools bring), and with traces on
(OTLP/HTTP to a sink on loopback that accepts and drops every export): traces off must cost
nothing against that, and on, what they cost.

The sides alternate at each client count. The clients run in this process (one event loop),
so on a 2-core machine they share the cores with the servers they drive: every side pays that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench.request_syncs import fsyncs_per_request
from bench.servers import ServerProcess, lockgate_env, lockgate_serve
from tests.support.asgi_thread import serve_in_thread

KEY = re.compile(r"lg_[A-Za-z0-9_\-]+")


class Side:
    """One side of the case: its server, its MCP URL, and the Bearer key its clients send
    (None: no auth)."""

    def __init__(self, server: ServerProcess, key: str | None) -> None:
        self.server, self.key = server, key
        self.url = f"{server.base_url}/mcp"


def start_lockgate(workdir: Path, name: str = "lockgate", **settings: str) -> Side:
    """`lockgate serve` on a fresh database of its own in `workdir/name`."""
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    env = lockgate_env(
        f"sqlite:///{folder / 'lockgate.db'}",
        folder,
        # The admission and rate limits are per principal, and every client here is the one
        # local principal: raised so that the case measures the server, not the limits.
        LOCKGATE_MAX_RUNNING_PER_PRINCIPAL="64",
        LOCKGATE_MAX_REQUESTS_PER_MINUTE="1000000",
        **{"LOCKGATE_WORKERS": "0", **settings},  # the default unless `settings` say
    )
    server = lockgate_serve(env, folder / "lockgate.out")
    # The first boot on a fresh database creates the local principal's key and prints it
    # before it serves.
    found = KEY.search(server.printed())
    if found is None:
        server.stop()
        raise RuntimeError(f"lockgate serve printed no key: {server.printed()[-2000:]}")
    return Side(server, found.group(0))


def start_plain(workdir: Path) -> Side:
    command = [sys.executable, "-m", "bench.plain_server"]
    return Side(ServerProcess(command, dict(os.environ), "/mcp", workdir / "plain.out"), None)


def start_fastmcp(workdir: Path) -> Side:
    command = [sys.executable, "-m", "bench.fastmcp_server"]
    return Side(ServerProcess(command, dict(os.environ), "/mcp", workdir / "fastmcp.out"), None)


async def _drop_spans(scope: Any, receive: Any, send: Any) -> None:
    """An OTLP/HTTP endpoint that accepts every export and keeps nothing (the cost measured
    is the server's: making, batching, encoding and sending its spans)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class Window:
    """The measured window: it opens once every client has its session and one call done,
    so connecting and the first call (the SDK's and the server's warm-up) stay out of it."""

    def __init__(self, clients: int, seconds: float) -> None:
        self.waiting, self.seconds = clients, seconds
        self.opened = asyncio.Event()
        self.start = self.until = 0.0

    def ready(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            self.start = time.monotonic()
            self.until = self.start + self.seconds
            self.opened.set()


async def _client(side: Side, window: Window, latencies: list[float]) -> None:
    headers = {"Authorization": f"Bearer {side.key}"} if side.key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60.0) as http,
        Client(streamable_http_client(side.url, http_client=http), mode="legacy") as client,
    ):
        await client.call_tool("execute", {"code": "1"})
        window.ready()
        await window.opened.wait()
        while time.monotonic() < window.until:
            started = time.perf_counter()
            result = await client.call_tool("execute", {"code": "1"})
            if result.is_error:
                raise RuntimeError(f"execute failed: {result.content}")
            latencies.append(time.perf_counter() - started)


def drive(side: Side, clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    window = Window(clients, seconds)

    async def run() -> float:
        await asyncio.gather(*(_client(side, window, latencies) for _ in range(clients)))
        return time.monotonic() - window.start  # the window, and the calls still in it

    elapsed = asyncio.run(run())
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
    return {
        "calls": len(latencies),
        "calls_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(ordered), 2) if ordered else None,
        "p99_ms": round(1000 * p99, 2),
    }


def side_by_side(clients: int, seconds: float, rounds: int = 1, **sides: Side) -> dict[str, Any]:
    """Each side driven by `clients` clients for `seconds`, one after the other, `rounds`
    times, in reverse order every other round; each side's round with the median calls/s."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for round_ in range(rounds):
        order = list(sides.items())
        for name, side in order if round_ % 2 == 0 else reversed(order):
            runs[name].append(drive(side, clients, seconds))
    return {
        "clients": clients,
        "rounds": rounds,
        **{
            name: sorted(found, key=lambda run: run["calls_per_second"])[len(found) // 2]
            for name, found in runs.items()
        },
    }


def mcp_throughput(workdir: Path, *, smoke: bool) -> dict[str, Any]:
    counts, seconds = ((1, 2), 1.0) if smoke else ((1, 8, 32), 8.0)
    published_clients, traced_clients = (4, 2) if smoke else (50, 8)
    with contextlib.ExitStack() as started:
        lockgate = start_lockgate(workdir)
        started.callback(lockgate.server.stop)
        plain = start_plain(workdir)
        started.callback(plain.server.stop)
        syncs = fsyncs_per_request(
            lockgate.url, lockgate.key, lockgate.server.pid, workdir, 10 if smoke else 100
        )
        rows = []
        for clients in counts:
            rows.append(
                {
                    "clients": clients,
                    "lockgate": drive(lockgate, clients, seconds),
                    "plain": drive(plain, clients, seconds),
                }
            )
        fastmcp = start_fastmcp(workdir)
        started.callback(fastmcp.server.stop)
        published = side_by_side(
            published_clients, seconds, lockgate=lockgate, fastmcp=fastmcp, plain=plain
        )
        one = start_lockgate(workdir, "one-worker", LOCKGATE_WORKERS="1")
        started.callback(one.server.stop)
        # What uvloop and httptools bring, on one process (two would share the cores with
        # the clients, which blurs it).
        stdlib = start_lockgate(
            workdir, "one-worker-asyncio", LOCKGATE_WORKERS="1", LOCKGATE_EVENT_LOOP="asyncio"
        )
        started.callback(stdlib.server.stop)
        sink = serve_in_thread(_drop_spans, "otlp-sink")
        started.callback(sink.close)
        traced = start_lockgate(
            workdir,
            "traced",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{next(sink)}",
        )
        started.callback(traced.server.stop)
        variants = side_by_side(
            traced_clients,
            seconds,
            # The variants differ by a tenth or less: single windows would not tell them
            # apart from the machine's noise.
            1 if smoke else 3,
            default=lockgate,
            one_worker=one,
            one_worker_asyncio=stdlib,
            traces_on=traced,
        )
        return {
            "seconds": seconds,
            "workers": _workers(lockgate),
            "rows": rows,
            "published": published,
            "variants": variants,
            "request_syncs": syncs,
        }


def _workers(side: Side) -> int:
    """How many worker processes the default `lockgate serve` ran (its banner says)."""
    found = re.search(r"\((\d+) worker processes\)", side.server.printed())
    return int(found.group(1)) if found else 1
