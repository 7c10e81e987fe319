"""Runs agent code in the pydantic-monty sandbox, one step at a time, with durable pauses.

A step runs the code until its next tool call, its end, or a failure. At a tool call the
sandbox is dumped and the step returns `Suspended` with the SEALED snapshot; the engine stores
it and may `resume` it much later, in another process, on a fresh worker. Everything that is
not a declared tool (imports, undefined names, files, sleeps) is answered here, inside the
step, so the engine only ever sees tool calls.

Monty facts this relies on (checked against 1.4.0, see the tests):
- Under `feed_start`, a call to a host function in an `ExternalModule` always surfaces as a
  `FunctionSnapshot`; the host function body runs only under `feed_run`/`resume_auto`, which we
  never use for tools. So tools are declared with a placeholder body that is never called.
- A dump carries the feed's limits and its elapsed execution time, so `max_duration_secs`
  bounds the whole execution across resumes; the limits a `resume` passes are ignored.
- Monty's suspension counter restarts at every load, so the tool-call budget across steps is
  ours: the count travels inside the sealed snapshot.
- Monty does not authenticate dumps (flipped bits can load and run), hence the digest.

The parts, each in a module of its own (all of their public names are importable from here):
- `machine.sandbox_results`: what a step returns (`Step`) and what a tool call answers
  (`ToolOutcome`);
- `machine.sandbox_snapshots`: the sealed envelope around a dump, and its errors;
- `machine.sandbox_limits`: `SandboxLimits`;
- `machine.sandbox_step`: one step, from a Monty feed to its `Step`;
- `machine.sandbox_workers`: the launcher that makes each worker die with its server
  (PR_SET_PDEATHSIG) and the one thread that forks workers;
- here, `Sandbox`: the pool of workers, fair slots, checkout, `stop` and `close`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence

from pydantic_monty import (
    FunctionSnapshot,
    Monty,
    MontyCrashedError,
    MontyRuntimeError,
    MontySession,
    SyncSnapshot,
)

from lockgate.machine.fair_slots import FairSlots
from lockgate.machine.sandbox_limits import SandboxLimits
from lockgate.machine.sandbox_results import (
    RAISABLE_EXCEPTIONS,
    Failed,
    FailureReason,
    Finished,
    Raised,
    Returned,
    SandboxStopped,
    Step,
    Suspended,
    ToolOutcome,
    ToolRequest,
)
from lockgate.machine.sandbox_snapshots import (
    MONTY_VERSION,
    RuntimeMismatch,
    SnapshotCorrupt,
    seal,
    sealed_version,
    unseal,
)
from lockgate.machine.sandbox_step import OS_POLICY, PRELUDE, StepDriver, StepLogs, tool_result
from lockgate.machine.sandbox_workers import Spawner, bound_worker_binary
from lockgate.machine.tools.spec import Namespace

#: The most namespaces (principals with sources of their own) whose declarations are kept.
CACHED_NAMESPACES = 64

__all__ = [
    "MONTY_VERSION",
    "RAISABLE_EXCEPTIONS",
    "Failed",
    "FailureReason",
    "Finished",
    "Raised",
    "Returned",
    "RuntimeMismatch",
    "Sandbox",
    "SandboxLimits",
    "SandboxStopped",
    "SnapshotCorrupt",
    "Step",
    "Suspended",
    "ToolOutcome",
    "ToolRequest",
    "seal",
    "sealed_version",
    "unseal",
]


class Sandbox:
    """Runs agent code with `tools.<source>.<tool>(...)` calls that suspend.

    One pool of Monty workers per Sandbox; each step checks out a worker of its own, so
    `start`/`resume` may be called from several threads at once (at most `max_processes`
    steps run at a time, the others wait for a worker). Workers are shared fairly: a step
    first takes a slot for its principal (see `FairSlots`), so one principal's steps occupy
    at most `max_per_principal` workers at once, and a freed worker goes to the waiting
    principal that holds the fewest.
    """

    def __init__(
        self,
        namespace: Mapping[str, Sequence[str]],
        limits: SandboxLimits | None = None,
        max_processes: int = 4,
        max_per_principal: int | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.namespace = {source: tuple(tools) for source, tools in namespace.items()}
        self._driver = StepDriver(self.namespace, self.limits)
        #: Drivers for other namespaces (principals with sources of their own), by namespace.
        self._drivers: OrderedDict[Namespace, StepDriver] = OrderedDict()
        #: One slot per worker: a step holding a slot always finds a worker free.
        self.slots = FairSlots(max_processes, max_per_principal or max_processes)
        self._spawner = Spawner()
        try:
            self._pool = Monty(
                binary_path=bound_worker_binary(),
                max_processes=max_processes,
                request_timeout=self.limits.worker_timeout,
            )
            self._spawner.run(self._pool.__enter__)  # forks the warm worker
        except BaseException:
            self._spawner.stop()
            raise
        self._closed = False
        self._lock = threading.Lock()
        #: Set by `stop`: every step still running, or started later, raises SandboxStopped.
        self._stopped = False
        #: The worker process of each step in flight (by its session), for `stop` to kill:
        #: Monty does not tell a worker's pid while a turn runs on another thread.
        self._workers: dict[int, int] = {}

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers. Call it once no step is running; later steps raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._pool.__exit__(None, None, None)  # ends the workers
        finally:
            self._spawner.stop()  # after: a worker the pool left behind dies with the thread

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def idle(self) -> bool:
        """Open, not stopped, and no step running or waiting: its workers hold nothing of
        anyone's (each step brings its code and snapshot, and takes its result away)."""
        with self._lock:
            if self._closed or self._stopped or self._workers:
                return False
        return self.slots.all_free()

    def stop(self) -> int:
        """Abandon every step in flight, at once, and refuse new ones: their workers are
        killed (SIGKILL; the pool replaces them), so each step raises SandboxStopped instead
        of running on to its end or its time limit. For a draining server, whose executions
        go on elsewhere from their last checkpoint. Returns how many steps were cut off."""
        with self._lock:
            self._stopped = True
            pids = list(self._workers.values())
        for pid in pids:
            # The worker may have ended its step (and its process) since we read it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def running(self) -> int:
        """How many steps are in flight in a worker now."""
        with self._lock:
            return len(self._workers)

    @contextlib.contextmanager
    def _tracked(self, session: MontySession) -> Iterator[None]:
        """Register the step's worker for `stop` (refusing the step if `stop` came first)."""
        pid = session.worker_pid
        with self._lock:
            if self._stopped:
                raise SandboxStopped()
            if pid is not None:
                self._workers[id(session)] = pid
        try:
            yield
        finally:
            with self._lock:
                self._workers.pop(id(session), None)

    def _driver_for(self, namespace: Namespace | None) -> StepDriver:
        """The driver declaring `namespace` (None: the sandbox's own)."""
        if namespace is None:
            return self._driver
        with self._lock:
            driver = self._drivers.get(namespace)
            if driver is not None:
                self._drivers.move_to_end(namespace)
                return driver
        driver = StepDriver(dict(namespace), self.limits)
        with self._lock:
            self._drivers[namespace] = driver
            while len(self._drivers) > CACHED_NAMESPACES:
                self._drivers.popitem(last=False)
        return driver

    @contextlib.contextmanager
    def _checkout(self, driver: StepDriver) -> Iterator[MontySession]:
        """A session on a worker of its own (taken from the pool, or forked for it)."""
        if self._stopped:
            raise SandboxStopped()
        if self._closed:
            raise RuntimeError("this Sandbox is closed")
        # An idle worker can die while nobody uses it (the OOM killer, an operator's kill):
        # entering a session on it reports the crash, and the pool replaces it on the next
        # checkout. That is no failure of the code about to run, so try a fresh one; at
        # most every slot's worker can be dead at once.
        for attempt in range(self.slots.capacity + 1):
            session = self._pool.checkout(
                limits=self.limits.resource_limits(),
                external_modules=driver.modules,
                os_policy=OS_POLICY,
            )
            # Entering may fork a worker, so on the spawner thread (see Spawner). It does
            # not wait there for a busy worker: the caller holds a slot, and each slot has a
            # worker.
            try:
                entered = self._spawner.run(session.__enter__)
                break
            except MontyCrashedError:
                if attempt == self.slots.capacity:
                    raise
        try:
            yield entered
        except BaseException as e:
            session.__exit__(type(e), e, e.__traceback__)
            raise
        session.__exit__(None, None, None)

    def start(self, code: str, *, principal: str, namespace: Namespace | None = None) -> Step:
        """Run `code` (on behalf of `principal`, with the tools of `namespace`: by default
        the sandbox's own) until its first tool call, its end, or a failure."""
        logs = StepLogs(self.limits.max_log_chars)
        driver = self._driver_for(namespace)
        with (
            self.slots.acquire(principal),
            self._checkout(driver) as session,
            self._tracked(session),
        ):

            def advance() -> SyncSnapshot:
                session.feed_run(PRELUDE)
                return session.feed_start(code, print_callback=logs)

            return driver.run(advance, 0, logs, stopped=lambda: self._stopped)

    def resume(
        self,
        sealed: bytes,
        outcome: ToolOutcome,
        *,
        principal: str,
        namespace: Namespace | None = None,
    ) -> Step:
        """Answer the pending tool call of a sealed snapshot and run to the next step (on
        behalf of `principal`, with the tools of `namespace`: by default the sandbox's own).

        Raises RuntimeMismatch or SnapshotCorrupt, before running any of the code.
        """
        dump, calls = unseal(sealed)
        logs = StepLogs(self.limits.max_log_chars)
        driver = self._driver_for(namespace)
        with (
            self.slots.acquire(principal),
            self._checkout(driver) as session,
            self._tracked(session),
        ):

            def advance() -> SyncSnapshot:
                try:
                    pending = session.load_snapshot(dump, print_callback=logs)
                except MontyRuntimeError as e:  # the digest matched, yet Monty refuses it
                    raise SnapshotCorrupt(f"the sandbox could not load it: {e}") from None
                if not isinstance(pending, FunctionSnapshot) or pending.is_os_function:
                    raise SnapshotCorrupt("it is not paused at a tool call")
                return pending.resume(tool_result(outcome))

            return driver.run(advance, calls, logs, stopped=lambda: self._stopped)
