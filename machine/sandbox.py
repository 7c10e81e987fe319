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
"""

from __future__ import annotations

import contextlib
import hashlib
import keyword
import os
import queue
import re
import shlex
import signal
import stat
import struct
import sys
import tempfile
import threading
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal, NoReturn, TypeVar, cast

import pydantic_monty
from pydantic import JsonValue
from pydantic_monty import (
    ExcType,
    ExternalModule,
    ExternalResult,
    FunctionSnapshot,
    Monty,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySession,
    MontySyntaxError,
    NameLookupSnapshot,
    ResourceLimits,
    SyncSnapshot,
)
from pydantic_monty._binary import find_monty_binary

from machine.errors import ErrorCode, LockgateError
from machine.fair_slots import FairSlots
from machine.values import limit_size, to_json, truncation_marker

MONTY_VERSION: str = pydantic_monty.__version__

T = TypeVar("T")

# --- results of a step ---------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRequest:
    """A tool call the code made: `name` is "source.tool" (without the "tools." prefix)."""

    name: str
    args: tuple[JsonValue, ...]
    kwargs: dict[str, JsonValue]


@dataclass(frozen=True)
class Suspended:
    """The code is paused at `request`; `snapshot` is sealed, pass it back to `resume`."""

    # Kept out of repr: it holds the program's live variables, tool results included.
    snapshot: bytes = field(repr=False)
    request: ToolRequest
    logs: str


@dataclass(frozen=True)
class Finished:
    output: JsonValue
    logs: str


class FailureReason(StrEnum):
    SYNTAX_ERROR = "syntax_error"
    RUNTIME_ERROR = "runtime_error"
    TIME_LIMIT = "time_limit"
    MEMORY_LIMIT = "memory_limit"
    RECURSION_LIMIT = "recursion_limit"
    CALL_LIMIT = "call_limit"
    SANDBOX_CRASHED = "sandbox_crashed"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Failed:
    """The execution is over; `message` is written for the user, never a host stack."""

    reason: FailureReason
    message: str
    logs: str


Step = Suspended | Finished | Failed

# --- what a tool call returns to the code ----------------------------------------------------

# Exceptions a tool may raise into the code: Monty's names minus those `except Exception`
# cannot catch (a tool error must be catchable like any other error).
RAISABLE_EXCEPTIONS: frozenset[str] = frozenset(typing.get_args(ExcType)) - {
    "BaseException",
    "SystemExit",
    "KeyboardInterrupt",
}


@dataclass(frozen=True)
class Returned:
    value: JsonValue


@dataclass(frozen=True)
class Raised:
    """The tool call raises `exc_type(message)` inside the code (e.g. "PermissionError")."""

    exc_type: str
    message: str

    def __post_init__(self) -> None:
        if self.exc_type not in RAISABLE_EXCEPTIONS:
            raise ValueError(
                f"{self.exc_type!r} is not an exception the sandbox can raise; use a builtin "
                "such as 'RuntimeError', 'ValueError' or 'PermissionError' and put any error "
                "code in the message"
            )


ToolOutcome = Returned | Raised

# --- errors ---------------------------------------------------------------------------------


class RuntimeMismatch(LockgateError):
    """The snapshot was made by another Monty version: it cannot be loaded by this one."""

    code = ErrorCode.RUNTIME_MISMATCH

    def __init__(self, *, sealed_version: str, running_version: str = MONTY_VERSION) -> None:
        self.sealed_version, self.running_version = sealed_version, running_version
        super().__init__(
            f"this execution was paused by sandbox runtime (Monty) {sealed_version}, but this "
            f"server runs Monty {running_version}: the paused execution cannot be resumed by "
            "this server version",
            hint=(
                "Re-execute the code from the start, or resume it on a server running Monty "
                f"{sealed_version}."
            ),
        )


class SandboxStopped(RuntimeError):
    """The step was cut off by `Sandbox.stop` (the server drains): it did not end, it was
    abandoned, and the engine hands its execution back from its last checkpoint. Never
    reaches a client, so it carries no error code."""

    def __init__(self) -> None:
        super().__init__("the sandbox was stopped while this step ran")


class SnapshotCorrupt(LockgateError):
    """The sealed snapshot is not one of ours, or its bytes changed since it was sealed."""

    code = ErrorCode.SNAPSHOT_CORRUPT

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"the stored snapshot of this paused execution is damaged ({detail}); it cannot "
            "be resumed",
            hint="Re-execute the code from the start.",
        )


# --- sealed snapshots -----------------------------------------------------------------------
# Layout: MAGIC | u8 length + ASCII Monty version | sha256(payload) | payload, where
# payload = u32 tool calls made so far | Monty dump. The version comes before the digest so a
# snapshot from another version is reported as a mismatch even if that version sealed
# differently. sha256 detects corruption, not tampering: whoever can write the store could
# recompute it.

_MAGIC = b"LGSNAP\x00\x01"
_DIGEST_LEN = 32
_CALLS = struct.Struct(">I")
_VERSION_RE = re.compile(rb"[0-9A-Za-z.+\-]{1,64}")


def seal(dump: bytes, calls: int, version: str = MONTY_VERSION) -> bytes:
    """Wrap a Monty dump in our envelope (`version` is a parameter for tests only)."""
    encoded = version.encode("ascii")
    payload = _CALLS.pack(calls) + dump
    return _MAGIC + bytes([len(encoded)]) + encoded + hashlib.sha256(payload).digest() + payload


def _open_envelope(sealed: bytes) -> tuple[str, bytes, bytes]:
    """(version, digest, payload); raises SnapshotCorrupt if it is not our envelope."""
    if not sealed.startswith(_MAGIC):
        raise SnapshotCorrupt("it is not a Lockgate snapshot")
    at = len(_MAGIC)
    length = sealed[at] if len(sealed) > at else 0
    version = sealed[at + 1 : at + 1 + length]
    if not _VERSION_RE.fullmatch(version):
        raise SnapshotCorrupt("its header is unreadable")
    at += 1 + length
    digest, payload = sealed[at : at + _DIGEST_LEN], sealed[at + _DIGEST_LEN :]
    return version.decode("ascii"), digest, payload


def sealed_version(sealed: bytes) -> str:
    """The Monty version that made a sealed snapshot, read without loading it."""
    return _open_envelope(sealed)[0]


def unseal(sealed: bytes) -> tuple[bytes, int]:
    """(Monty dump, tool calls made so far); raises RuntimeMismatch or SnapshotCorrupt."""
    version, digest, payload = _open_envelope(sealed)
    if version != MONTY_VERSION:
        raise RuntimeMismatch(sealed_version=version)
    if len(payload) < _CALLS.size or hashlib.sha256(payload).digest() != digest:
        raise SnapshotCorrupt("its checksum does not match")
    (calls,) = _CALLS.unpack_from(payload)
    return payload[_CALLS.size :], calls


# --- limits ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxLimits:
    # Execution time of the whole run, summed over its steps; time spent waiting for tools
    # (or for approvals) does not count.
    max_duration_secs: float = 30.0
    max_memory_bytes: int = 256 * 1024 * 1024
    max_recursion_depth: int = 200
    # Tool calls over the whole execution. Within one step Monty also caps its own
    # suspensions (imports of tools, undefined names) at the same number.
    max_calls: int = 1000
    # The host-side watchdog: a worker silent for this long in one step is killed
    # (-> sandbox_crashed). None: max_duration_secs + 10, so the in-sandbox limit fires first.
    worker_timeout_secs: float | None = None
    max_output_bytes: int = 1024 * 1024
    max_log_chars: int = 100_000

    def __post_init__(self) -> None:
        for name in (
            "max_duration_secs",
            "max_memory_bytes",
            "max_recursion_depth",
            "max_calls",
            "max_log_chars",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive")
        if self.worker_timeout_secs is not None and self.worker_timeout_secs <= 0:
            raise ValueError("SandboxLimits.worker_timeout_secs must be positive")
        limit_size(None, self.max_output_bytes)  # rejects a max_output_bytes that is too small

    @property
    def worker_timeout(self) -> float:
        if self.worker_timeout_secs is not None:
            return self.worker_timeout_secs
        return self.max_duration_secs + 10.0

    def resource_limits(self) -> ResourceLimits:
        return ResourceLimits(
            max_feed_duration_secs=self.max_duration_secs,
            max_memory=self.max_memory_bytes,
            max_recursion_depth=self.max_recursion_depth,
            max_suspensions=self.max_calls,
        )


# --- the sandbox ----------------------------------------------------------------------------

# Binds `tools` as a global before the agent's code, so `tools.x.y()` works without an import.
_PRELUDE = "import tools"
# Sleeps return at once: a paused execution should wait on tools, not hold a worker.
_OS_POLICY: pydantic_monty.OSPolicy = {"sleep": "zero"}
_SLEEPS = frozenset({"time.sleep", "asyncio.sleep", "system.sleep", "system.async_sleep"})
_UNSUPPORTED_PREFIX = "The monty syntax parser does not yet support "


def _never_called(*args: object, **kwargs: object) -> NoReturn:
    # Tool calls always suspend under feed_start; reaching this is a bug in this module.
    raise RuntimeError("a Lockgate tool body ran inside the sandbox; tools must suspend")


def _tools_module(namespace: Mapping[str, Sequence[str]]) -> ExternalModule:
    for name in (*namespace, *(t for tools in namespace.values() for t in tools)):
        # Monty hides "_" names; keywords and non-identifiers could never be called.
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise ValueError(f"{name!r} cannot be a tool source or tool name in the sandbox")
    return ExternalModule(
        {
            source: ExternalModule(dict.fromkeys(tools, _never_called))
            for source, tools in namespace.items()
        }
    )


class _Logs:
    """The step's print output (stdout and stderr, in order), capped at `max_chars`."""

    def __init__(self, max_chars: int) -> None:
        self._parts: list[str] = []
        self._room = max_chars
        self._omitted = 0

    def __call__(self, stream: Literal["stdout", "stderr"], text: str) -> None:
        kept = text[: max(self._room, 0)]
        if kept:
            self._parts.append(kept)
            self._room -= len(kept)
        self._omitted += len(text) - len(kept)

    def text(self) -> str:
        text = "".join(self._parts)
        return text + truncation_marker(self._omitted) if self._omitted else text


# --- worker processes -----------------------------------------------------------------------
# A worker must die with its server: after a SIGKILL of the server (no handler, no cleanup)
# an orphaned worker would go on running the agent's code until its time limit, while the
# restarted server recovers and runs the same execution again. Only the kernel can act once
# the server is SIGKILLed, so each worker asks it, before it runs anything, for a SIGKILL of
# its own when its parent goes: PR_SET_PDEATHSIG. A process group would need someone alive
# to kill it, and EOF on stdin reaches a worker only when it next reads, not inside a loop.
#
# Monty 1.4.0 forks its workers in Rust (std's posix_spawn, with an emptied environment) and
# offers no pre-exec hook, so the prctl happens in a launcher that `Monty(binary_path=...)`
# runs in place of `monty`: it sets PR_SET_PDEATHSIG, then execs `monty` (the setting
# survives exec). A server that dies before the prctl leaves no runaway: a worker speaks
# first (its hello) and the pool sends nothing before reading it, so that worker never gets
# code and exits at EOF on stdin.
#
# PR_SET_PDEATHSIG fires when the *thread* that forked the worker exits, not the process.
# Monty forks in the thread that enters the pool (its warm worker) or a session (when no
# worker is idle: steps at once, after a worker crashed or was killed), and steps run on
# threads that come and go (anyio's end after 10 s idle), so every such call goes to
# `_Spawner`: one thread that lives as long as the Sandbox. Nothing else forks (checked
# against 1.4.0: a session's and the pool's exit only end workers); a test in
# tests/test_sandbox_orphans.py checks which thread forked a step's worker.

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


def _bound_worker_binary() -> str | None:
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


class _Spawner:
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
        self._modules = {"tools": _tools_module(self.namespace)}
        self._tool_names = frozenset(
            f"tools.{source}.{tool}" for source, tools in self.namespace.items() for tool in tools
        )
        #: One slot per worker: a step holding a slot always finds a worker free.
        self.slots = FairSlots(max_processes, max_per_principal or max_processes)
        self._spawner = _Spawner()
        try:
            self._pool = Monty(
                binary_path=_bound_worker_binary(),
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

    @contextlib.contextmanager
    def _checkout(self) -> Iterator[MontySession]:
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
                external_modules=self._modules,
                os_policy=_OS_POLICY,
            )
            # Entering may fork a worker, so on the spawner thread (see _Spawner). It does
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

    def start(self, code: str, *, principal: str) -> Step:
        """Run `code` (on behalf of `principal`) until its first tool call, its end, or a
        failure."""
        logs = _Logs(self.limits.max_log_chars)
        with self.slots.acquire(principal), self._checkout() as session, self._tracked(session):

            def advance() -> SyncSnapshot:
                session.feed_run(_PRELUDE)
                return session.feed_start(code, print_callback=logs)

            return self._run(advance, 0, logs)

    def resume(self, sealed: bytes, outcome: ToolOutcome, *, principal: str) -> Step:
        """Answer the pending tool call of a sealed snapshot and run to the next step (on
        behalf of `principal`).

        Raises RuntimeMismatch or SnapshotCorrupt, before running any of the code.
        """
        dump, calls = unseal(sealed)
        logs = _Logs(self.limits.max_log_chars)
        with self.slots.acquire(principal), self._checkout() as session, self._tracked(session):

            def advance() -> SyncSnapshot:
                try:
                    pending = session.load_snapshot(dump, print_callback=logs)
                except MontyRuntimeError as e:  # the digest matched, yet Monty refuses it
                    raise SnapshotCorrupt(f"the sandbox could not load it: {e}") from None
                if not isinstance(pending, FunctionSnapshot) or pending.is_os_function:
                    raise SnapshotCorrupt("it is not paused at a tool call")
                return pending.resume(_result(outcome))

            return self._run(advance, calls, logs)

    def _run(self, advance: Callable[[], SyncSnapshot], calls: int, logs: _Logs) -> Step:
        """Drive the code to its next tool call, answering everything else in place."""
        try:
            snap = advance()
            while True:
                if isinstance(snap, MontyComplete):
                    output = limit_size(to_json(snap.output), self.limits.max_output_bytes)
                    return Finished(output, logs.text())
                if isinstance(snap, FunctionSnapshot) and snap.function_name in self._tool_names:
                    if snap.allow_eager_await:
                        # `await tools.x.y()`: the plain value we would answer with cannot be
                        # awaited, so stop before the tool runs rather than after.
                        message = (
                            f"tool calls are ordinary function calls in the sandbox: write "
                            f"`{snap.function_name}(...)` without `await`"
                        )
                        return Failed(FailureReason.UNSUPPORTED, message, logs.text())
                    calls += 1
                    if calls > self.limits.max_calls:
                        message = (
                            f"the code made more than {self.limits.max_calls} tool calls, "
                            "the limit for one execution"
                        )
                        return Failed(FailureReason.CALL_LIMIT, message, logs.text())
                    request = ToolRequest(
                        name=snap.function_name.removeprefix("tools."),
                        args=tuple(to_json(a) for a in snap.args),
                        kwargs={k: to_json(v) for k, v in snap.kwargs.items()},
                    )
                    return Suspended(seal(snap.dump(), calls), request, logs.text())
                snap = self._answer(snap)
        except MontySyntaxError as e:
            message = f"{e.display('type-msg')}{_line(e)}"
            return Failed(FailureReason.SYNTAX_ERROR, message, logs.text())
        except MontyRuntimeError as e:
            reason, message = self._describe(e)
            return Failed(reason, message, logs.text())
        except MontyCrashedError as e:
            if self._stopped:  # killed by `stop`: abandoned, not a crash of the code's
                raise SandboxStopped() from None
            if e.timed_out:
                message = (
                    f"the sandbox stopped responding for {self.limits.worker_timeout:g} s and "
                    "was shut down; the execution is lost"
                )
            else:
                message = f"the sandbox process stopped unexpectedly ({e}); the execution is lost"
            return Failed(FailureReason.SANDBOX_CRASHED, message, logs.text())
        except MontyError as e:  # e.g. a result Monty cannot convert
            return Failed(FailureReason.RUNTIME_ERROR, str(e), logs.text())

    def _answer(self, snap: SyncSnapshot) -> SyncSnapshot:
        """The sandbox's answer to a suspension that is not a declared tool call."""
        if isinstance(snap, NameLookupSnapshot):
            return snap.resume()  # no value: NameError in the code
        if not isinstance(snap, FunctionSnapshot):
            # A FutureSnapshot needs a call answered with a future, which we never do.
            raise RuntimeError(f"unexpected sandbox suspension: {snap!r}")
        name = str(snap.function_name)
        if snap.is_os_function:
            if name == "import":  # `import tools...`; answered from external_modules
                return snap.resume_auto()
            if name in _SLEEPS:
                return snap.resume({"return_value": None})
            return snap.resume(
                {
                    "exc_type": "PermissionError",
                    "message": f"{name}: files, the network and the environment are not "
                    "available in the sandbox",
                }
            )
        if name.startswith("tools."):  # in a resumed dump, but no longer declared here
            module, _, attr = name.rpartition(".")
            message = f"module '{module}' has no attribute '{attr}'"
            return snap.resume({"exc_type": "AttributeError", "message": message})
        # A call to a name the code never defined.
        return snap.resume({"exc_type": "NameError", "message": f"name '{name}' is not defined"})

    def _describe(self, e: MontyRuntimeError) -> tuple[FailureReason, str]:
        """An uncaught error in the code, or a limit, as a reason and a user's message."""
        inner, text = e.exception(), e.display("msg")
        limits = self.limits
        if isinstance(inner, TimeoutError) and "time limit exceeded" in text:
            return FailureReason.TIME_LIMIT, (
                f"the code ran longer than its {limits.max_duration_secs:g} s limit "
                "(time spent waiting for tools does not count)"
            )
        if isinstance(inner, MemoryError) and "memory limit exceeded" in text:
            mib = limits.max_memory_bytes / (1024 * 1024)
            return FailureReason.MEMORY_LIMIT, f"the code used more than its {mib:g} MiB of memory"
        if isinstance(inner, RecursionError):
            return FailureReason.RECURSION_LIMIT, (
                f"the code went deeper than {limits.max_recursion_depth} nested calls "
                f"(maximum recursion depth exceeded){_line(e)}"
            )
        if isinstance(inner, RuntimeError) and text.startswith("suspension limit"):
            return FailureReason.CALL_LIMIT, (
                f"the code made more than {limits.max_calls} calls out of the sandbox in one "
                "step (tool calls, imports of tools, calls to undefined names)"
            )
        if isinstance(inner, NotImplementedError) and text.startswith(_UNSUPPORTED_PREFIX):
            feature = text.removeprefix(_UNSUPPORTED_PREFIX)
            return FailureReason.UNSUPPORTED, (
                f"this Python feature is not supported in the sandbox: {feature}{_line(e)}; "
                "rewrite the code without it"
            )
        return FailureReason.RUNTIME_ERROR, f"{e.display('type-msg')}{_line(e)}"


def _result(outcome: ToolOutcome) -> ExternalResult:
    if isinstance(outcome, Returned):
        return {"return_value": outcome.value}
    # exc_type was checked against ExcType's names when the Raised was made.
    return {"exc_type": cast(ExcType, outcome.exc_type), "message": outcome.message}


def _line(e: MontyRuntimeError | MontySyntaxError) -> str:
    """The " (line N)" suffix naming the innermost frame in the agent's code, if any."""
    # Frames from exec()/eval() strings are "<string>"; the agent's code is "<python-input-N>".
    frames = [f for f in e.traceback() if f.filename.startswith("<python-input")]
    return f" (line {frames[-1].line})" if frames else ""
