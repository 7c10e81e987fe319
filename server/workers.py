"""Several server processes behind one port: `lockgate serve` with more than one worker.

Each worker is an instance of its own, as a server on another box would be: its own runtime,
lease, sandboxes and database connections, on the one database. Nothing a worker holds in
memory is needed by another: sessions, executions, approvals and what a client is owed live
in the database, and any instance serves any of them (a fleet behind a load balancer without
affinity works the same way). Durable sessions are what make this possible: the plain MCP
SDK keeps a session in the memory of the process that opened it.

The supervisor is the process `lockgate serve` started. It binds the port once and forks the
workers, which inherit the listening socket; the kernel hands each new connection to a worker
that is accepting. A worker accepts only once its boot recovery finished, so a connection
made while the box boots waits in the backlog for a ready worker instead of being refused.
The supervisor holds no state and serves nothing. It:

- forwards SIGTERM and SIGINT to every worker (each drains as a single server does) and exits
  0 once they have stopped, killing any still running `stop_within` seconds later;
- replaces a worker that dies while serving, in the same slot and under the same instance
  name, so the replacement recovers its predecessor's work at once instead of waiting for the
  lease to lapse;
- stops, and exits 2, when a worker cannot start at all (the configuration is what is wrong,
  and every replacement would fail the same way);
- takes its workers with it when it is killed itself (Linux's parent-death signal): a
  SIGKILLed server leaves nothing serving behind it, and its work is recovered as a crashed
  server's is.

Why not uvicorn's own `workers`: it spawns each worker as a fresh interpreter that imports the
server again (about 2 s of CPU each, at every replacement), runs a plain `uvicorn.Server`
without the drain, and does not tie a worker's life to its parent's. A fork after the imports
costs none of that.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

log = logging.getLogger("lockgate.server")

#: A worker's exit status when it could not start (its configuration is refused): the
#: supervisor stops instead of replacing it.
CANNOT_START = 2
#: The shortest time between two starts of one slot: a worker that dies at once is not
#: replaced in a hot loop.
RESTART_PAUSE_SECS = 1.0


@dataclass(frozen=True)
class Startup:
    """A worker's part in the start. Once its application is built it calls `built`, which
    returns when the supervisor lets every worker serve: after every worker was built, and
    after the banner and the first key (so no request is served by a server whose start is
    then refused, and the banner is out before anything is served)."""

    created: Event
    go: Event

    def built(self) -> None:
        self.created.set()
        self.go.wait()


#: What a worker runs: given its slot and its `Startup`, it builds its application, calls
#: `built`, and serves on the inherited socket until told to stop. It raises
#: `WorkerRefused` when it cannot start.
WorkerMain = Callable[[int, Startup], None]


class WorkerRefused(Exception):
    """A worker cannot start (a source it cannot serve, secrets it cannot read): its message
    goes to the supervisor, which says it once and stops."""


def default_count() -> int:
    """One worker per CPU core this process may run on (its affinity, not the box's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def worker_count(setting: int, database_url: str) -> int:
    """How many workers `setting` (0: one per core) means for this database: an in-memory
    SQLite database lives in one process, so it always gets one."""
    if database_url.startswith("sqlite") and ":memory:" in database_url:
        return 1
    return setting or default_count()


def instance_name(base: str, slot: int) -> str:
    """A worker's instance name: the server's, with its slot. Stable across replacements, so
    a replacement recovers its predecessor's work at once."""
    return f"{base}#{slot}"


def listen(host: str, port: int) -> socket.socket:
    """The one listening socket every worker accepts on (OSError when it cannot be bound)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG;
    no library wraps it). Elsewhere nothing: a worker then outlives a killed supervisor."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


@dataclass
class Slot:
    """One worker's place: its process now, and when that was started."""

    index: int
    process: BaseProcess | None = None
    created: Event | None = None
    started: float = 0.0
    #: When a replacement may start (a slot whose worker died at once waits a little).
    due: float = 0.0
    exits: list[int | None] = field(default_factory=list)


class Supervisor:
    """Forks `count` workers running `main` and keeps them running until told to stop."""

    def __init__(self, count: int, main: WorkerMain, *, stop_within: float) -> None:
        self.main = main
        self.stop_within = stop_within
        self.slots = [Slot(index) for index in range(count)]
        self._context = multiprocessing.get_context("fork")
        self._stopping = False
        #: Where a worker that cannot start says why.
        self._refusals, self._refusing = self._context.Pipe(duplex=False)
        #: Set once every worker may serve (`Startup`).
        self._go = self._context.Event()
        #: A signal's handler writes here, so that the supervisor's wait wakes.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    def _start(self, slot: Slot) -> None:
        created = self._context.Event()
        process = self._context.Process(
            target=_run_worker,
            args=(self.main, slot.index, Startup(created, self._go), self._refusing),
            name=f"worker-{slot.index}",
        )
        process.start()
        slot.process, slot.created, slot.started = process, created, time.monotonic()

    def start(self) -> str | None:
        """Start every worker and wait until each has built its application (none serves
        yet: `serve`). When one could not: every worker stopped, and why (None when all
        were built). SIGTERM and SIGINT are taken from here on: one that comes while the
        workers start stops them all, drained, instead of killing this process."""
        signal.set_wakeup_fd(self._wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        for slot in self.slots:
            self._start(slot)
        for slot in self.slots:
            assert slot.process is not None and slot.created is not None
            while not slot.created.wait(0.05):
                if slot.process.exitcode is not None:
                    self.stop()
                    return self._refusal(slot)
        return None

    def serve(self) -> int:
        """Let every worker serve, and keep them serving until SIGTERM or SIGINT (replacing
        those that die); then stop them all. The exit status: 0, or `CANNOT_START` when a
        replacement could not start."""
        self._go.set()
        status = 0
        try:
            while not self._stopping:
                status = self._watch()
                if status:
                    break
        finally:
            signal.set_wakeup_fd(-1)
        self.stop()
        return status

    def _refusal(self, slot: Slot) -> str:
        """Why the worker in `slot`, which ended before it started, could not start."""
        if self._refusals.poll():
            return str(self._refusals.recv())
        assert slot.process is not None
        return f"worker {slot.index} ended with status {slot.process.exitcode} as it started"

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stopping = True

    def _watch(self) -> int:
        now = time.monotonic()
        waiting = [s for s in self.slots if s.process is None]
        timeout = max(0.0, min(s.due for s in waiting) - now) if waiting else None
        live = [s.process.sentinel for s in self.slots if s.process is not None]
        woken = wait([self._wake_read, *live], timeout)
        if self._wake_read in woken:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 512)
        if self._stopping:
            return 0
        for slot in self.slots:
            if slot.process is None or slot.process.sentinel not in woken:
                continue
            slot.process.join()
            code = slot.process.exitcode
            slot.exits.append(code)
            assert slot.created is not None
            if code == CANNOT_START and not slot.created.is_set():
                log.error("cannot start: %s; stopping", self._refusal(slot))
                return CANNOT_START
            log.warning(
                "worker %d (pid %s) ended with status %s; starting a replacement",
                slot.index,
                slot.process.pid,
                code,
            )
            slot.process, slot.due = None, slot.started + RESTART_PAUSE_SECS
        for slot in self.slots:
            if slot.process is None and slot.due <= time.monotonic():
                self._start(slot)
        return 0

    def stop(self) -> None:
        """SIGTERM every worker, wait `stop_within` seconds for them to drain, then SIGKILL
        whatever is left."""
        self._stopping = True
        running = [s.process for s in self.slots if s.process is not None]
        for process in running:
            if process.exitcode is None and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_within
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in running:
            if process.exitcode is None:
                log.warning("worker pid %s did not stop in time: killing it", process.pid)
                process.kill()
                process.join()

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self.slots if s.process is not None and s.process.pid]


def _run_worker(main: WorkerMain, slot: int, startup: Startup, refusing: Connection) -> None:
    """A worker's first steps after the fork: tied to its parent's life, with the default
    signal dispositions back (the supervisor's handlers only set its own flag)."""
    die_with_parent()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    try:
        main(slot, startup)
    except WorkerRefused as refused:
        refusing.send(str(refused))
        sys.exit(CANNOT_START)
