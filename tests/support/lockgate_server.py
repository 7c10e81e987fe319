"""One real `lockgate serve` process on loopback, as a test sees it from outside.

`LockgateServer` wraps the process a `Deployment` started (forked warm or exec'd: see
`simulation.warm_start`, seen through `Popen`'s own names): its URLs, what it printed (the
banner's API key on stdout, the JSON log on stderr, both read back from files so no pipe
is left unclosed), readiness (polling /readyz with a deadline, never a bare sleep), and
stopping it gracefully (SIGTERM) or not (SIGKILL).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from lockgate.simulation.warm_start import ServerPopen

#: The console script installed next to the interpreter running the tests (.venv/bin).
LOCKGATE = Path(sys.executable).with_name("lockgate")
#: A server must be ready (or a command finish) within this many seconds.
START_TIMEOUT = 60.0
KEY_PATTERN = re.compile(r"\blg_[A-Za-z0-9_-]{20,}")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class LockgateServer:
    name: str
    port: int
    popen: ServerPopen
    stdout_path: Path
    stderr_path: Path
    instance_id: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp"

    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def output(self) -> str:
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def printed_keys(self) -> list[str]:
        """Every distinct API key the process printed (the banner shows a new one once)."""
        return list(dict.fromkeys(KEY_PATTERN.findall(self.stdout())))

    def log_lines(self) -> list[str]:
        """Complete lines only: the process may be writing the last one right now."""
        text = self.stderr()
        lines = text.split("\n")[:-1]  # whatever follows the last newline is incomplete
        return [line for line in lines if line.strip()]

    def log_records(self) -> list[dict[str, Any]]:
        """The structured log: every stderr line must be one JSON object."""
        records = []
        for line in self.log_lines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                pytest.fail(f"server {self.name} logged a line that is not JSON: {line!r}")
            assert isinstance(record, dict), line
            records.append(record)
        return records

    def exited(self) -> int | None:
        return self.popen.poll()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Poll /readyz until it answers 200; fail early if the process died."""
        deadline = time.monotonic() + timeout
        with httpx2.Client(timeout=2.0) as http:
            while True:
                code = self.exited()
                if code is not None:
                    pytest.fail(
                        f"server {self.name} exited ({code}) before ready:\n{self.output()}"
                    )
                try:
                    response = http.get(f"{self.base_url}/readyz")
                except httpx2.TransportError:
                    response = None
                if response is not None and response.status_code == 200:
                    self.instance_id = response.json()["instance"]
                    return
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(f"server {self.name} not ready in {timeout:g} s:\n{self.output()}")
                time.sleep(0.05)

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            pytest.fail(f"server {self.name} did not exit in {timeout:g} s:\n{self.output()}")

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (a graceful stop) and its exit code."""
        if self.exited() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> int:
        """SIGKILL: the process gets no chance to clean up."""
        if self.exited() is None:
            self.popen.send_signal(signal.SIGKILL)
        return self.popen.wait(timeout=30)
