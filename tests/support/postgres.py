"""A real, throwaway PostgreSQL server on loopback for the test session.

The server binaries come from the system's packages (`.ci/run` installs Debian's
postgresql). The cluster lives in a temporary directory, listens on 127.0.0.1 only and is
stopped when the test session ends. Each test gets its own database, copied from a migrated
template (fast).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from lockgate.simulation.ports import free_port


def find_bin_dir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]))
    for candidate in reversed(candidates):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    def __init__(self, bin_dir: Path, *, durable: bool = False) -> None:
        """`durable`: commits really reach the disk (the benchmarks); the tests run with
        fsync off, which changes no behaviour they check."""
        self.bin_dir = bin_dir
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="lockgate-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0  # initdb refuses to run as root

    def _run(self, *args: str) -> None:
        command = list(args)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        if self._as_postgres:
            shutil.chown(self.root, user="postgres")
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.root}"
            + ("" if self.durable else " -c fsync=off"),
            "start",
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        try:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, template: str | None = None) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            clause = f" TEMPLATE {template}" if template else ""
            conn.execute(f"CREATE DATABASE {name}{clause}")
        return name
