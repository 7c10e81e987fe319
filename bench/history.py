"""Case 5: boot to ready, and what a quiet server costs, against the history it keeps.

For each history size a SQLite database is filled with that many finished executions plus
the live ones (paused, waiting for a decision due tomorrow), then a real `lockgate serve`
process is started on it:

- **boot to ready**: from spawning the process to its first `200` from `/readyz` (the
  interpreter's start and imports included: what an operator or a platform's health check
  waits for);
- **idle CPU**: the server process's user + system time over a quiet window after ready,
  as a share of one core (its background loops: lease heartbeat, sweeps, the claim loop).

The empty database is the reference: a server's idle cost should depend on the work it has
live, not on its history. History rows are executions only (`completed`, no tool calls or
transition log), inserted in bulk: the loops read executions, through the live indexes.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from bench.servers import lockgate_env, lockgate_serve
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import Execution

BATCH = 20_000
#: After ready, the boot's own recovery and first sweeps settle before the window opens.
SETTLE_SECS = 3.0


def seed(url: str, history: int, live: int) -> None:
    """`history` finished executions and `live` paused ones, in bulk."""
    now = datetime.now(UTC)
    engine = open_engine(url)
    try:
        upgrade(engine)
        table = Execution.__table__  # type: ignore[attr-defined]

        def row(n: int, status: str) -> dict[str, Any]:
            return {
                "id": f"{status[:4]}-{n:08d}",
                "principal_id": f"p{n % 50}",
                "status": status,
                "code": "tools.bench.read()",
                "created_at": now - timedelta(seconds=history - n),
                "updated_at": now,
                "deadline": now + timedelta(days=1) if status != "completed" else None,
                "session_id": None,
                "version": 0,
                "calls_made": 0,
                "logs": "",
            }

        for start in range(0, history, BATCH):
            batch = [row(n, "completed") for n in range(start, min(history, start + BATCH))]
            with engine.begin() as conn:
                conn.execute(insert(table), batch)
        with engine.begin() as conn:
            if live:
                conn.execute(
                    insert(table), [row(n, "waiting_for_interaction") for n in range(live)]
                )
    finally:
        engine.dispose()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, workdir: Path, window: float) -> dict[str, float]:
    """Start a server on `url`; the seconds it took to be ready and its idle CPU share."""
    server = lockgate_serve(lockgate_env(url, workdir), workdir / "lockgate.out")
    try:
        time.sleep(SETTLE_SECS)
        before, opened = _cpu_seconds(server.pid), time.monotonic()
        time.sleep(window)
        spent, elapsed = _cpu_seconds(server.pid) - before, time.monotonic() - opened
        return {
            "boot_seconds": round(server.ready_seconds, 3),
            "idle_cpu_percent": round(100 * spent / elapsed, 2),
        }
    finally:
        server.stop()


def history_cost(workdir: Path, *, smoke: bool) -> dict[str, Any]:
    sizes, live, window = (
        ((0, 2_000), 10, 1.0) if smoke else ((0, 10_000, 100_000, 1_000_000), 1_000, 20.0)
    )
    rows = []
    for history in sizes:
        folder = workdir / f"history-{history}"
        folder.mkdir()
        url = f"sqlite:///{folder / 'lockgate.db'}"
        seeded = time.monotonic()
        seed(url, history, live)
        seed_seconds = round(time.monotonic() - seeded, 1)
        rows.append(
            {"history": history, "live": live, "seed_seconds": seed_seconds}
            | measure(url, folder, window)
        )
    return {"window_seconds": window, "settle_seconds": SETTLE_SECS, "rows": rows}
