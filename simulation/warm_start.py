"""Server processes forked from one that has already imported the server.

Importing what `lockgate serve` runs (the MCP SDK's protocol models for two protocol
versions, FastAPI, SQLAlchemy, ...) costs about two seconds of CPU, nearly all of a boot.
The simulator's real-process runs, the soak and the test suite start hundreds of servers,
and paid it for each. Here a `multiprocessing` fork server imports it once (per process
that starts servers); each server is a fork of it that then does what `python -m <module>
<args>` does, with its own arguments, environment, working directory and output files.

Each is a real process of its own: its own pid, killed and stopped by real signals, its
exit status read back as `subprocess.Popen` reads it (a SIGKILL is -9). Only the imports
are shared. What a fresh interpreter would do differently (read an environment variable at
import time, say) is not tested this way: the console script, the wheel and the container
image each have their own cold-start tests, and `LOCKGATE_COLD_START=1` starts every
server with exec instead (the module run by a new interpreter, as an operator's would be).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

#: What the fork server imports before it forks anyone: the server, its CLI, the
#: simulator's server (each is imported by every kind of server started here).
PRELOADED = ["lockgate.server.app", "lockgate.server.cli", "lockgate.simulation.serve", "uvicorn"]
#: Set to 1 to start every server with exec (a new interpreter), not forked.
COLD_START = "LOCKGATE_COLD_START"


class ServerPopen(Protocol):
    """What a harness does with a server process: `subprocess.Popen`'s own names."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...


class WarmProcess:
    """A forked server, seen as a `Popen` is. Its parent is the fork server, which reads
    its exit status and hands it over (`multiprocessing` does, through the sentinel)."""

    def __init__(self, process: BaseProcess, args: Sequence[str]) -> None:
        self._process = process
        self.args = list(args)
        assert process.pid is not None
        self.pid: int = process.pid
        self._lock = threading.Lock()

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        # As Popen does, no signal once the exit is known (the pid may be another process's
        # by then). The fork server reaps the process and reports its status a moment
        # later: a signal in that moment goes to a pid nobody has had time to reuse.
        with self._lock:
            if self._process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _lockgate(args: list[str]) -> None:
    from lockgate.server.cli import app

    app(args=args, prog_name="lockgate")


def _simulation_server(args: list[str]) -> None:
    from lockgate.simulation.serve import main

    sys.exit(main(args))


#: The programs a fork can become, by the module `python -m` would run (each one's
#: `__main__` block, called directly: running an imported module again as `__main__` makes
#: `runpy` warn on stderr, which a server's JSON log must not carry).
PROGRAMS: dict[str, Callable[[list[str]], None]] = {
    "lockgate.server.cli": _lockgate,
    "lockgate.simulation.serve": _simulation_server,
}


def _forked_main(
    module: str, args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str
) -> None:
    """In the fork: become `python -m module args` with this environment and output. Its
    `SystemExit` (the CLI's exit code) becomes the process's exit status."""
    for fd, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [module, *args]
    # A program of its own, as after an exec: it may start processes of its own (`lockgate
    # serve` forks its workers), which `multiprocessing` refuses to a daemonic process. Only
    # this process's own record changes; its parent still stops it when it exits.
    multiprocessing.current_process().daemon = False
    PROGRAMS[module](args)


_context_lock = threading.Lock()
_context: multiprocessing.context.ForkServerContext | None = None


def context() -> multiprocessing.context.ForkServerContext:
    """The fork server's `multiprocessing` context, for a pool whose workers start servers
    of their own: forked from the fork server, a worker starts a fork server of its own. (A
    worker forked from a process that already has one could not use it: `multiprocessing`
    would wait on a fork server that is not the worker's child.)"""
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOADED)
            _context = context
        return _context


def start(
    module: str,
    args: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    stdout: Path,
    stderr: Path,
) -> ServerPopen:
    """Start `python -m module args`, its output appended to `stdout` and `stderr` (the
    same file may be given for both): forked from the warm fork server, or a new
    interpreter when `LOCKGATE_COLD_START=1` (in this process's environment or `env`)."""
    command = [sys.executable, "-m", module, *args]
    if module not in PROGRAMS or "1" in (os.environ.get(COLD_START), env.get(COLD_START)):
        with open(stdout, "ab") as out, open(stderr, "ab") as err:
            return subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )
    process = context().Process(
        target=_forked_main,
        args=(module, list(args), dict(env), str(cwd), str(stdout), str(stderr)),
        name=f"{module} {' '.join(args)}",
        # Stopped (SIGTERM) if the process that started it exits first: not left behind.
        daemon=True,
    )
    process.start()
    return WarmProcess(process, command)


__all__ = ["COLD_START", "PRELOADED", "PROGRAMS", "ServerPopen", "WarmProcess", "context", "start"]
