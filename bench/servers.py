"""Server processes the benchmark starts on loopback (`lockgate serve`, the plain SDK peer):
started, polled until ready, timed, and stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from lockgate.simulation.ports import free_port

LOCKGATE = Path(sys.executable).with_name("lockgate")
READY_LIMIT_SECS = 120.0


def lockgate_env(database_url: str, workdir: Path, **settings: str) -> dict[str, str]:
    """This process's environment without any LOCKGATE_ setting of the caller's, on
    `database_url` with its notes in `workdir`, plus `settings` (LOCKGATE_... = value)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_")}
    # The model accepts its own calls (approval mode `model`): the benches and the tests that
    # use this stand in for the person with resume's accept; a test of the other modes sets
    # LOCKGATE_APPROVAL_MODE itself.
    env.update(
        DATABASE_URL=database_url,
        LOCKGATE_NOTES_DIR=str(workdir / "notes"),
        LOCKGATE_APPROVAL_MODE="model",
        # One process: the cases that read a server's memory, CPU or boot measure an
        # instance, and a supervisor's own figures would say nothing of its workers. Case 3
        # runs the default (one worker per core), as a user's server does.
        LOCKGATE_WORKERS="1",
    )
    env.update(settings)
    return env


class ServerProcess:
    """A server started with `command` on a free port, returned once `ready_path` answers
    (any status under 500); `ready_seconds` is from the spawn to that answer."""

    def __init__(
        self, command: list[str], env: dict[str, str], ready_path: str, output: Path
    ) -> None:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        #: What the process prints, in a file: a pipe nobody reads would fill and stall it.
        self.output = output
        started = time.monotonic()
        with output.open("w") as sink:
            self.process = subprocess.Popen(
                [*command, str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT
            )
        try:
            self._wait_ready(ready_path, started)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started

    @property
    def pid(self) -> int:
        return self.process.pid

    def printed(self) -> str:
        return self.output.read_text()

    def _wait_ready(self, path: str, started: float) -> None:
        with httpx2.Client(timeout=2.0) as http:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited before ready: {self.printed()[-2000:]}")
                try:
                    if http.get(f"{self.base_url}{path}").status_code < 500:
                        return
                except httpx2.TransportError:
                    pass
                if time.monotonic() - started > READY_LIMIT_SECS:
                    raise RuntimeError(
                        f"the server was not ready in time: {self.printed()[-2000:]}"
                    )
                time.sleep(0.01)  # a poll interval of the measurement, not a wait for an event

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def lockgate_serve(env: dict[str, str], output: Path) -> ServerProcess:
    """`lockgate serve`, ready when `/readyz` answers."""
    return ServerProcess([str(LOCKGATE), "serve", "--port"], env, "/readyz", output)
