"""Case 3's count: fsyncs per MCP `execute` request, on the running server, counted.

`strace -f -p` is attached to the running `lockgate serve` (every thread) while one client
sends `execute {"code": "1"}` requests one after another; the `fsync`/`fdatasync` calls it
sees are counted, then counted again over an idle window of the same length (the server's
own background work: heartbeats, sweeps), and the difference is divided by the requests.

An execution that makes no call waits for the disk twice: its creation and its end (case 4).
Anything more per request would be the request's own bookkeeping (its owed entry, that
entry's answer, the session's activity), which the spec commits without waiting for the disk.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

FSYNCS = ("fsync(", "fdatasync(")
ATTACH_LIMIT_SECS = 30.0


def with_workers(pid: int) -> list[int]:
    """The process and its children (a `lockgate serve` supervisor's workers), by /proc."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [pid, *(int(p) for p in children.read_text().split())] if children.exists() else [pid]


class Tracer:
    """`strace` attached to every thread of a process and of its workers, counting their
    fsyncs until stopped."""

    def __init__(self, pid: int, log: Path) -> None:
        strace = shutil.which("strace")
        if strace is None:
            raise RuntimeError("strace is not installed (.ci/run installs it)")
        self.log = log
        pids = with_workers(pid)
        self.process = subprocess.Popen(
            [
                strace,
                "-f",
                "-e",
                "trace=fsync,fdatasync",
                "-o",
                str(log),
                *(arg for p in pids for arg in ("-p", str(p))),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        attached = threading.Event()
        # strace says "Process N attached with T threads" once it holds every thread of a
        # process (threads started later are followed): the count starts when each is held.
        threading.Thread(target=self._read, args=(attached, len(pids)), daemon=True).start()
        if not attached.wait(ATTACH_LIMIT_SECS):
            self.process.kill()
            raise RuntimeError(f"strace did not attach to {pids}")

    def _read(self, attached: threading.Event, processes: int) -> None:
        assert self.process.stderr is not None
        held = 0
        for line in self.process.stderr:
            if "attached" in line:
                held += 1
                if held >= processes:
                    attached.set()

    def stop(self) -> int:
        """Detach and return the fsyncs seen."""
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=30)
        text = self.log.read_text()
        self.log.unlink()
        return sum(1 for line in text.splitlines() if any(call in line for call in FSYNCS))


def fsyncs_per_request(
    url: str, key: str | None, pid: int, workdir: Path, requests: int
) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60.0) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            await client.call_tool("execute", {"code": "1"})  # warm: session, worker, key
            tracer = await asyncio.to_thread(Tracer, pid, workdir / "request-syncs.log")
            started = time.monotonic()
            for _ in range(requests):
                result = await client.call_tool("execute", {"code": "1"})
                if result.is_error:
                    raise RuntimeError(f"execute failed: {result.content}")
            busy = time.monotonic() - started
            busy_syncs = await asyncio.to_thread(tracer.stop)
        tracer = await asyncio.to_thread(Tracer, pid, workdir / "request-syncs.log")
        await asyncio.sleep(busy)  # the idle window: as long as the busy one
        idle_syncs = await asyncio.to_thread(tracer.stop)
        return {
            "requests": requests,
            "fsyncs": busy_syncs,
            "idle_fsyncs": idle_syncs,
            "fsyncs_per_request": round(max(0, busy_syncs - idle_syncs) / requests, 2),
        }

    return asyncio.run(run())
