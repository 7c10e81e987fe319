"""Case 4: commits and fsyncs per execution with N calls, counted, not estimated.

Commits are SQLAlchemy `commit` events on the side's engine (`bench.sides.CommitCounter`):
for Lockgate those of transactions that may write (a view's read-only transaction ends with
a COMMIT that writes and flushes nothing), for DBOS every COMMIT sent, its reads' included.
Fsyncs are the disk's side of it:

- SQLite: the process is run under `strace -f` and the `fsync`/`fdatasync` calls between two
  markers (a `stat` of a path that does not exist, made just before and just after the
  measured execution) are counted.
- PostgreSQL: the server's own `pg_stat_wal.wal_sync` (WAL flushes) before and after.

Run as `python -m bench.counting SIDE DATABASE_URL WORKDIR N`; it prints one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from bench.sides import BareCommits, DbosSide, LockgateSide, Side

BEGIN, END = "/nonexistent/lockgate-bench-begin", "/nonexistent/lockgate-bench-end"
FSYNCS = ("fsync(", "fdatasync(")


def build(side: str, database_url: str, workdir: Path) -> Side:
    if side == "lockgate_reads":
        return LockgateSide(database_url, workdir, kind="reads")
    if side == "lockgate_writes":
        return LockgateSide(database_url, workdir, kind="writes")
    if side == "dbos":
        return DbosSide(database_url)
    if side == "bare_commit":
        return BareCommits(database_url)
    raise SystemExit(f"unknown side {side!r}")


#: PostgreSQL publishes a backend's WAL statistics at most once a second, when it is idle
#: (PGSTAT_MIN_INTERVAL): a read this long after the last statement sees them all.
STATS_SETTLE_SECS = 1.5


def wal_syncs(database_url: str) -> int:
    time.sleep(STATS_SETTLE_SECS)
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT wal_sync FROM pg_stat_wal")).scalar_one())
    finally:
        engine.dispose()


def measure(side_name: str, database_url: str, workdir: Path, n: int) -> dict[str, object]:
    """In this process: one warm-up execution, then the counted one."""
    side = build(side_name, database_url, workdir)
    try:
        side.run(n)
        counter = getattr(side, "commits", None)
        before_commits = counter.count if counter is not None else None
        sqlite = database_url.startswith("sqlite")
        before_syncs = None if sqlite else wal_syncs(database_url)
        os.path.exists(BEGIN)
        side.run(n)
        os.path.exists(END)
        out: dict[str, object] = {"side": side_name, "n": n}
        if counter is not None and before_commits is not None:
            out["commits"] = counter.count - before_commits
        if before_syncs is not None:
            out["fsyncs"] = wal_syncs(database_url) - before_syncs
        return out
    finally:
        side.close()


def count(side: str, database_url: str, workdir: Path, n: int) -> dict[str, object]:
    """Run `measure` in a child process (under strace on SQLite) and read its counts."""
    command = [sys.executable, "-m", "bench.counting", side, database_url, str(workdir), str(n)]
    trace = workdir / f"strace-{side}-{n}.log"
    sqlite = database_url.startswith("sqlite")
    strace = shutil.which("strace") if sqlite else None
    if strace is not None:
        command = [
            strace,
            "-f",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,newfstatat,stat",
            "-o",
            str(trace),
            *command,
        ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"counting {side} N={n} failed:\n{done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if strace is not None:
        result["fsyncs"] = fsyncs_between_markers(trace.read_text())
        trace.unlink()
    return result


def fsyncs_between_markers(log: str) -> int:
    inside, fsyncs = False, 0
    for line in log.splitlines():
        if BEGIN in line:
            inside = True
        elif END in line:
            return fsyncs
        elif inside and any(call in line for call in FSYNCS):
            fsyncs += 1
    raise RuntimeError("the strace log has no end marker")


if __name__ == "__main__":
    name, url, where, calls = sys.argv[1:5]
    print(json.dumps(measure(name, url, Path(where), int(calls))))
