"""Case 6: what paused work and idle sessions cost a server, and resuming after a restart.

One real `lockgate serve` on a fresh SQLite file, driven over streamable HTTP by the SDK's
client (8 clients, one 2025 session each):

- **RSS per 1,000 paused executions**: how much the server's resident memory grows while
  its clients start 1,000 executions that each pause on a call needing approval
  (`notes.write`), in three rounds after a warm-up of as many executions that complete.
  Paused work lives in the database: what the process keeps for it grows every round by the
  same amount, while the heap's own warm-up shrinks from one round to the next.
- **RSS per 1,000 idle sessions**: the same, for sessions opened (`initialize`, then the
  `initialized` notification, by hand) and then left alone.
- **Resume after restart**: the server is stopped (SIGTERM) and started again on the same
  file (with every round's paused executions); the clients then accept the last round's
  paused calls (`resume`), each an MCP request that runs the rest of the execution. p50 and
  p99 of those requests, and the first one's.

RSS is what the operator sees (`VmRSS`): CPython seldom hands freed memory back, so it is
the high-water mark of what the work cost, not only what is still referenced.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench.mcp_throughput import KEY
from bench.servers import ServerProcess, lockgate_env, lockgate_serve
from tests.support.raw_mcp import RawMCP

CLIENTS = 8
PAUSING_CODE = 'tools.notes.write(key="bench", text="resumed")'


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _serve(workdir: Path, output: str) -> ServerProcess:
    env = lockgate_env(
        f"sqlite:///{workdir / 'lockgate.db'}",
        workdir,
        LOCKGATE_MAX_PAUSED_PER_PRINCIPAL="1000000",
        LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL="1000000",
        LOCKGATE_MAX_RUNNING_PER_PRINCIPAL="64",
        LOCKGATE_MAX_REQUESTS_PER_MINUTE="1000000",
    )
    return lockgate_serve(env, workdir / output)


async def _each_client(
    url: str, key: str, work: list[Any], call: str, make: Any, latencies: list[float]
) -> list[Any]:
    """CLIENTS clients share `work`: each takes the next item and calls `call` with
    `make(item)`; the structured answers, in completion order."""
    answers: list[Any] = []

    async def client() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120.0) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as session,
        ):
            while work:
                item = work.pop()
                started = time.perf_counter()
                result = await session.call_tool(call, make(item))
                latencies.append(time.perf_counter() - started)
                if result.is_error:
                    raise RuntimeError(f"{call} failed: {result.content}")
                answers.append(result.structured_content)

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return answers


def _execute(url: str, key: str, count: int, code: str) -> list[Any]:
    return asyncio.run(
        _each_client(url, key, list(range(count)), "execute", lambda _: {"code": code}, [])
    )


def _pause(url: str, key: str, count: int) -> list[str]:
    answers = _execute(url, key, count, PAUSING_CODE)
    ids = [a["executionId"] for a in answers if a["status"] == "waiting_for_interaction"]
    if len(ids) != count:
        raise RuntimeError(f"{count - len(ids)} executions did not pause: {answers[:3]}")
    return ids


def _open_idle_sessions(url: str, key: str | None, count: int) -> None:
    with httpx2.Client(timeout=60.0) as http:
        for _ in range(count):
            if RawMCP(http, url, key, "legacy").initialize().status_code != 200:
                raise RuntimeError("a session could not be opened")


def _resume(url: str, key: str, ids: list[str]) -> dict[str, Any]:
    latencies: list[float] = []
    answers = asyncio.run(
        _each_client(
            url,
            key,
            list(reversed(ids)),
            "resume",
            lambda execution_id: {"executionId": execution_id, "action": "accept"},
            latencies,
        )
    )
    if any(a["status"] != "completed" for a in answers):
        raise RuntimeError(f"a resumed execution did not complete: {answers[:3]}")
    ordered = sorted(latencies)
    return {
        "resumed": len(ordered),
        "first_ms": round(1000 * latencies[0], 2),
        "p50_ms": round(1000 * statistics.median(ordered), 2),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
    }


def _plain_sessions_mib(workdir: Path, sessions: int) -> float:
    """The peer's figure: a plain SDK `MCPServer` (`bench/plain_server.py`), warmed up with
    a fifth as many sessions, then as many idle sessions opened the same way."""
    command = [sys.executable, "-m", "bench.plain_server"]
    plain = ServerProcess(command, dict(os.environ), "/mcp", workdir / "plain.out")
    try:
        url = f"{plain.base_url}/mcp"
        _open_idle_sessions(url, None, max(1, sessions // 5))
        start = rss_mib(plain.pid)
        _open_idle_sessions(url, None, sessions)
        return round((rss_mib(plain.pid) - start) * 1000 / sessions, 2)
    finally:
        plain.stop()


def resume_cost(workdir: Path, *, smoke: bool) -> dict[str, Any]:
    paused, sessions, rounds = (10, 10, 1) if smoke else (1_000, 1_000, 3)
    server = _serve(workdir, "first.out")
    try:
        found = KEY.search(server.printed())
        if found is None:
            raise RuntimeError(f"lockgate serve printed no key: {server.printed()[-2000:]}")
        key, url = found.group(0), f"{server.base_url}/mcp"
        # Warm-up, as many requests as a round, of executions that complete: the first
        # requests grow any process by several MiB (imports, the sandbox's workers,
        # compiled statements, each session's replay log filling up to its bound), whatever
        # their executions do.
        _execute(url, key, paused, "1")
        before = rss_mib(server.pid)
        growth, ids = [], []
        for _ in range(rounds):
            start = rss_mib(server.pid)
            ids = _pause(url, key, paused)
            growth.append(round((rss_mib(server.pid) - start) * 1000 / paused, 2))
        after_paused = rss_mib(server.pid)
        _open_idle_sessions(url, key, sessions)
        after_sessions = rss_mib(server.pid)
    finally:
        server.stop()
    server = _serve(workdir, "second.out")
    try:
        resumed = _resume(f"{server.base_url}/mcp", key, ids)
        boot = server.ready_seconds
    finally:
        server.stop()
    plain = _plain_sessions_mib(workdir, sessions)
    return {
        "paused": paused,
        "rounds": rounds,
        "sessions": sessions,
        "rss_before_mib": round(before, 1),
        "rss_after_paused_mib": round(after_paused, 1),
        "rss_per_1000_paused_mib_by_round": growth,
        "rss_per_1000_sessions_mib": round((after_sessions - after_paused) * 1000 / sessions, 2),
        "plain_rss_per_1000_sessions_mib": plain,
        "restart_boot_seconds": round(boot, 3),
        "resume": resumed,
    }
