"""What the figures were measured on: they mean little without it."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
from datetime import UTC, datetime
from importlib.metadata import version


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem(path: str) -> str:
    done = subprocess.run(["df", "-T", path], capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines()
    return lines[1].split()[1] if len(lines) > 1 else "unknown"


def describe() -> dict[str, object]:
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "filesystem": _filesystem("/var/tmp"),
        "packages": {
            name: version(name)
            for name in ("lockgate", "dbos", "pydantic-monty", "SQLAlchemy", "psycopg", "mcp")
        },
    }
