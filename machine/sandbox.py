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

import hashlib
import keyword
import re
import struct
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NoReturn, cast

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

from machine.errors import ErrorCode, LockgateError
from machine.fair_slots import FairSlots
from machine.values import limit_size, to_json, truncation_marker

MONTY_VERSION: str = pydantic_monty.__version__

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
        self._pool = Monty(max_processes=max_processes, request_timeout=self.limits.worker_timeout)
        self._pool.__enter__()
        self._closed = False
        self._lock = threading.Lock()

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
        self._pool.__exit__(None, None, None)

    def _checkout(self) -> MontySession:
        if self._closed:
            raise RuntimeError("this Sandbox is closed")
        return self._pool.checkout(
            limits=self.limits.resource_limits(),
            external_modules=self._modules,
            os_policy=_OS_POLICY,
        )

    def start(self, code: str, *, principal: str) -> Step:
        """Run `code` (on behalf of `principal`) until its first tool call, its end, or a
        failure."""
        logs = _Logs(self.limits.max_log_chars)
        with self.slots.acquire(principal), self._checkout() as session:

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
        with self.slots.acquire(principal), self._checkout() as session:

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
