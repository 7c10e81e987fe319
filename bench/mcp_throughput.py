"""Case 3: MCP `execute` calls per second, and their p50 and p99, at 1, 8 and 32 clients.

Both sides are real processes on loopback, driven by the SDK's own client over streamable
HTTP (2025 sessions, one session per client, each client calling in a loop):

- `lockgate serve` on a fresh SQLite file, `execute {"code": "1"}`: a durable execution
  (journal, checkpoint, result) and the MCP request's own bookkeeping;
- the peer: a plain SDK `MCPServer` whose `execute` tool runs nothing and keeps nothing
  (`bench/plain_server.py`).

The sides alternate at each client count. The clients run in this process (one event loop),
so on a 2-core machine they share the cores with the server they drive: both sides pay that.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from lockgate.simulation.ports import free_port

LOCKGATE = Path(sys.executable).with_name("lockgate")
KEY = re.compile(r"lg_[A-Za-z0-9_\-]+")
READY_LIMIT_SECS = 60.0


class Side:
    """One server process: its URL and the Bearer key its clients send (None: no auth)."""

    def __init__(
        self, command: list[str], env: dict[str, str], port: int, ready: str, output: Path
    ) -> None:
        self.url = f"http://127.0.0.1:{port}/mcp"
        #: What the process prints, in a file: a pipe nobody reads would fill and stall it.
        self.output = output
        with output.open("w") as sink:
            self.process = subprocess.Popen(
                command, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True
            )
        self.key: str | None = None
        started = time.monotonic()
        with httpx2.Client(timeout=2.0) as http:
            while True:
                if self.process.poll() is not None:
                    printed = output.read_text()[-2000:]
                    raise RuntimeError(f"{command[:3]} exited before ready: {printed}")
                try:
                    if http.get(f"http://127.0.0.1:{port}{ready}").status_code < 500:
                        break
                except httpx2.TransportError:
                    pass
                if time.monotonic() - started > READY_LIMIT_SECS:
                    raise RuntimeError(f"{command[:3]} was not ready in time")
                time.sleep(0.05)  # a poll interval of the set-up, not a wait for an event

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_lockgate(workdir: Path) -> Side:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_")}
    env.update(
        DATABASE_URL=f"sqlite:///{workdir / 'lockgate.db'}",
        LOCKGATE_NOTES_DIR=str(workdir / "notes"),
        # The admission and rate limits are per principal, and every client here is the one
        # local principal: raised so that the case measures the server, not the limits.
        LOCKGATE_MAX_RUNNING_PER_PRINCIPAL="64",
        LOCKGATE_MAX_REQUESTS_PER_MINUTE="1000000",
    )
    output = workdir / "lockgate.out"
    side = Side([str(LOCKGATE), "serve", "--port", str(port)], env, port, "/readyz", output)
    # The first boot on a fresh database creates the local principal's key and prints it
    # before it serves.
    found = KEY.search(output.read_text())
    if found is None:
        side.stop()
        raise RuntimeError(f"lockgate serve printed no key: {output.read_text()[-2000:]}")
    side.key = found.group(0)
    return side


def start_plain(workdir: Path) -> Side:
    port = free_port()
    command = [sys.executable, "-m", "bench.plain_server", str(port)]
    return Side(command, dict(os.environ), port, "/mcp", workdir / "plain.out")


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


def mcp_throughput(workdir: Path, *, smoke: bool) -> dict[str, Any]:
    counts, seconds = ((1, 2), 1.0) if smoke else ((1, 8, 32), 8.0)
    lockgate, plain = start_lockgate(workdir), start_plain(workdir)
    try:
        rows = []
        for clients in counts:
            rows.append(
                {
                    "clients": clients,
                    "lockgate": drive(lockgate, clients, seconds),
                    "plain": drive(plain, clients, seconds),
                }
            )
        return {"seconds": seconds, "rows": rows}
    finally:
        lockgate.stop()
        plain.stop()
