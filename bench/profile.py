"""Where a busy server's CPU goes: `lockgate serve` under case 3's load, sampled by py-spy.

    .venv/bin/python -m bench.profile LABEL [--clients 8] [--seconds 8] [--note TEXT]

starts a server as case 3 does, drives it with that many SDK clients, samples the thread
holding the GIL in each worker process (a worker is GIL-bound under load: one core each) with
`py-spy record --gil --subprocesses`,
and adds to `bench/profiles.json` under LABEL: calls per second, the GIL's milliseconds per
request, and the share of samples by what the innermost frame belongs to (its self time by
package). `make bench` renders every label side by side in RESULTS.md. To profile an older
commit, export it (`git archive`) and run this with PYTHONPATH pointing at that copy: the
server is started with this process's environment.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.mcp_throughput import drive, start_lockgate

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "profiles.json"
RATE = 200

#: What a frame's file belongs to, first match wins (paths as py-spy prints them).
OWNERS: tuple[tuple[str, str], ...] = (
    ("SQLAlchemy ORM and SQLModel", r"^(sqlalchemy/orm/|sqlmodel/)"),
    ("SQLAlchemy Core and the driver", r"^sqlalchemy/"),
    ("Lockgate's engine (machine/)", r"^machine/"),
    ("Lockgate's server (server/)", r"^server/"),
    ("the MCP SDK", r"^mcp/"),
    (
        "HTTP (uvicorn, h11, starlette, fastapi, sse)",
        r"^(uvicorn|h11|starlette|fastapi|sse_starlette)/",
    ),
    ("async plumbing (asyncio, anyio)", r"^(asyncio|anyio)/"),
    ("threads and queues", r"^(threading|queue|concurrent)"),
    ("pydantic", r"^pydantic"),
    ("spec machines (transitions)", r"^transitions/"),
)
OTHER = "the standard library and the rest"


def owner(frame: str) -> str:
    found = re.search(r"\((.*?):\d+\)$", frame)
    path = found.group(1) if found else ""
    for name, pattern in OWNERS:
        if re.search(pattern, path):
            return name
    return OTHER


def shares(raw: Path) -> tuple[int, dict[str, float]]:
    """Samples in a py-spy raw file, and the percent of them by the innermost frame's owner."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        counts[owner(stack.split(";")[-1])] += int(count)
    total = sum(counts.values())
    return total, {k: round(100 * v / total, 1) for k, v in counts.most_common()}


def profile(clients: int, seconds: float) -> dict[str, Any]:
    spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory(prefix="lockgate-profile-") as tmp:
        work = Path(tmp)
        side = start_lockgate(work)
        try:
            drive(side, clients, 2.0)  # warm-up
            raw = work / "profile.txt"
            sampler = subprocess.Popen(
                [str(spy), "record", "-p", str(side.server.pid), "-f", "raw", "-o", str(raw),
                 "-r", str(RATE), "-d", str(int(seconds)), "--gil", "--subprocesses"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            measured = drive(side, clients, seconds)
            sampler.wait(timeout=120)
        finally:
            side.server.stop()
        samples, by_owner = shares(raw)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "clients": clients,
        "calls_per_second": measured["calls_per_second"],
        "gil_ms_per_request": round(1000 * samples / RATE / measured["calls"], 2),
        "shares": by_owner,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("label", help="what this profile is of (a commit, 'before', 'after')")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--note", default="", help="what the profiled code is, or changed")
    args = parser.parse_args()
    found = json.loads(PROFILES.read_text()) if PROFILES.exists() else {}
    found[args.label] = {"note": args.note, **profile(args.clients, args.seconds)}
    PROFILES.write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found[args.label], indent=1))


if __name__ == "__main__":
    main()
