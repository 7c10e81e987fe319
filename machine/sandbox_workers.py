"""Worker processes that die with their server, and the one thread that forks them.

A worker must die with its server: after a SIGKILL of the server (no handler, no cleanup)
an orphaned worker would go on running the agent's code until its time limit, while the
restarted server recovers and runs the same execution again. Only the kernel can act once
the server is SIGKILLed, so each worker asks it, before it runs anything, for a SIGKILL of
its own when its parent goes: PR_SET_PDEATHSIG. A process group would need someone alive
to kill it, and EOF on stdin reaches a worker only when it next reads, not inside a loop.

Monty 1.4.0 forks its workers in Rust (std's posix_spawn, with an emptied environment) and
offers no pre-exec hook, so the prctl happens in a launcher that `Monty(binary_path=...)`
runs in place of `monty`: it sets PR_SET_PDEATHSIG, then execs `monty` (the setting
survives exec). A server that dies before the prctl leaves no runaway: a worker speaks
first (its hello) and the pool sends nothing before reading it, so that worker never gets
code and exits at EOF on stdin.

PR_SET_PDEATHSIG fires when the *thread* that forked the worker exits, not the process.
Monty forks in the thread that enters the pool (its warm worker) or a session (when no
worker is idle: steps at once, after a worker crashed or was killed), and steps run on
threads that come and go (anyio's end after 10 s idle), so every such call goes to
`Spawner`: one thread that lives as long as the Sandbox. Nothing else forks (checked
against 1.4.0: a session's and the pool's exit only end workers); a test in
tests/processes/test_sandbox_orphans.py checks which thread forked a step's worker.
"""

from __future__ import annotations

import hashlib
import os
import queue
import shlex
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from pydantic_monty._binary import find_monty_binary

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
# Run as `python -I -S -c _BIND_TO_PARENT <monty> subprocess ...`. SIGPIPE and SIGXFSZ go
# back to their defaults: Python ignores them, and exec would pass that on to monty.
_BIND_TO_PARENT = f"""\
import ctypes, os, signal, sys
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
if prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL, 0, 0, 0) != 0:
    sys.exit("lockgate: PR_SET_PDEATHSIG failed: " + os.strerror(ctypes.get_errno()))
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])
"""


def bound_worker_binary() -> str | None:
    """The launcher Monty runs as its worker binary; None where PR_SET_PDEATHSIG does not
    exist (not Linux): workers then end through `Sandbox.close` only."""
    if sys.platform != "linux" or not sys.executable:
        return None
    monty = os.path.abspath(find_monty_binary())
    # /bin/sh rather than a `#!python` line, which takes one argument and a short path only.
    script = (
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S -c "
        f'{shlex.quote(_BIND_TO_PARENT)} {shlex.quote(monty)} "$@"\n'
    )
    # The script names no process, so this user's servers share one file per (python, monty)
    # and a SIGKILLed server leaves nothing behind. Each Sandbox rewrites it (atomically), so
    # it always matches this code.
    directory = Path(tempfile.gettempdir()) / f"lockgate-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        # Made by someone else, or a symlink: not a place to keep what the server executes.
        directory = Path(tempfile.mkdtemp(prefix="lockgate-"))
    path = directory / f"monty-worker-{hashlib.sha256(script.encode()).hexdigest()[:16]}"
    fd, partial = tempfile.mkstemp(dir=directory, prefix=".monty-worker-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(script)
        os.chmod(partial, 0o700)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
    return str(path)


class Spawner:
    """One thread, alive from the Sandbox's start to its close, running every call that may
    fork a worker: each worker's PR_SET_PDEATHSIG is then tied to a thread that ends only
    when the Sandbox closes or the process dies."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # A daemon: a Sandbox never closed must not keep the interpreter from exiting (its
        # workers then die with the process, as after a SIGKILL).
        self._thread = threading.Thread(
            target=self._serve, name="lockgate-sandbox-spawner", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    def run(self, fn: Callable[[], T]) -> T:
        """`fn()`, run on the spawner thread while the caller waits."""
        if os.getpid() != self._pid:  # a fork copies no threads: nothing would run it
            raise RuntimeError("this Sandbox was made by another process (before a fork)")
        done: Future[T] = Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:  # re-raised in the caller; the thread lives on
                done.set_exception(e)

        self._calls.put(call)
        return done.result()

    def stop(self) -> None:
        """End the thread; a worker it forked that is still alive gets SIGKILL as it ends."""
        self._calls.put(None)
        self._thread.join()
