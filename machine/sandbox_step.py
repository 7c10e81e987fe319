"""One step of agent code: from a Monty feed to the `Step` it ends with.

Under `feed_start`, a call to a host function in an `ExternalModule` always surfaces as a
`FunctionSnapshot`; the host function body runs only under `feed_run`/`resume_auto`, which the
sandbox never uses for tools. So tools are declared here with a placeholder body that is never
called, and a step stops at the first declared tool call. Everything else the code asks of the
host (imports, undefined names, files, sleeps) is answered here, inside the step, so the
engine only ever sees tool calls; Monty's errors and limits become a `Failed` with a message
written for the user.
"""

from __future__ import annotations

import difflib
import keyword
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NoReturn, cast

import pydantic_monty
from pydantic_monty import (
    ExcType,
    ExternalModule,
    ExternalResult,
    FunctionSnapshot,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
    NameLookupSnapshot,
    SyncSnapshot,
)

from lockgate.machine.sandbox_limits import SandboxLimits
from lockgate.machine.sandbox_results import (
    Failed,
    FailureReason,
    Finished,
    Returned,
    SandboxStopped,
    Step,
    Suspended,
    ToolOutcome,
    ToolRequest,
)
from lockgate.machine.sandbox_snapshots import seal
from lockgate.machine.values import limit_size, to_json, truncation_marker

# Binds `tools` as a global before the agent's code, so `tools.x.y()` works without an import.
PRELUDE = "import tools"
# Sleeps return at once: a paused execution should wait on tools, not hold a worker. Monty
# answers them itself under this policy, before and after a snapshot is loaded, so they never
# reach `_answer` (checked against 1.4.0: tests/unit/test_sandbox.py).
OS_POLICY: pydantic_monty.OSPolicy = {"sleep": "zero"}
_UNSUPPORTED_PREFIX = "The monty syntax parser does not yet support "


def _never_called(*args: object, **kwargs: object) -> NoReturn:
    # Tool calls always suspend under feed_start; reaching this is a bug in this module.
    raise RuntimeError("a Lockgate tool body ran inside the sandbox; tools must suspend")


def tools_module(namespace: Mapping[str, Sequence[str]]) -> ExternalModule:
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


class StepLogs:
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


class StepDriver:
    """What a Sandbox's steps share: its tools, declared for Monty, and its limits, which
    decide when a step fails and how the failure reads."""

    def __init__(self, namespace: Mapping[str, Sequence[str]], limits: SandboxLimits) -> None:
        self.limits = limits
        self.namespace = namespace
        #: The `external_modules` of every session: `tools.<source>.<tool>`, never called.
        self.modules = {"tools": tools_module(namespace)}
        self._tool_names = frozenset(
            f"tools.{source}.{tool}" for source, tools in namespace.items() for tool in tools
        )

    def run(
        self,
        advance: Callable[[], SyncSnapshot],
        calls: int,
        logs: StepLogs,
        *,
        stopped: Callable[[], bool],
    ) -> Step:
        """Drive the code to its next tool call, answering everything else in place.

        `advance` runs the step's first feed, `calls` counts the tool calls made before this
        step, and `stopped` says whether `Sandbox.stop` killed the worker (so that a crash is
        an abandoned step, not a failure of the code)."""
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
            if stopped():  # killed by `Sandbox.stop`: abandoned, not a crash of the code's
                raise SandboxStopped() from None
            if e.timed_out:
                message = (
                    f"the sandbox stopped responding for {self.limits.worker_timeout:g} s and "
                    "was shut down; the execution is lost"
                )
            else:
                message = f"the sandbox process stopped unexpectedly ({e}); the execution is lost"
            return Failed(FailureReason.SANDBOX_CRASHED, message, logs.text())
        except MontyError as e:
            # Monty's other errors (a lost connection to the worker, a shutdown not of our
            # making): the code fails with Monty's words rather than the server with an
            # internal error. A result Monty cannot convert is a MontyRuntimeError, above.
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
        hint = missing_tool_hint(text, self.namespace) if isinstance(inner, AttributeError) else ""
        return FailureReason.RUNTIME_ERROR, f"{e.display('type-msg')}{_line(e)}{hint}"


def tool_result(outcome: ToolOutcome) -> ExternalResult:
    """A tool's outcome as Monty's answer to the pending call."""
    if isinstance(outcome, Returned):
        return {"return_value": outcome.value}
    # exc_type was checked against ExcType's names when the Raised was made.
    return {"exc_type": cast(ExcType, outcome.exc_type), "message": outcome.message}


_MISSING = re.compile(r"module 'tools(?:\.(\w+))?' has no attribute '(\w+)'")


def missing_tool_hint(message: str, namespace: Mapping[str, Sequence[str]]) -> str:
    """For a mistyped source or tool name: the closest names there are, and where to look."""
    found = _MISSING.search(message)
    if found is None:
        return ""
    source, name = found.groups()
    if source is None:
        close = [f"tools.{n}" for n in difflib.get_close_matches(name, list(namespace), 3, 0.6)]
    else:
        tools = namespace.get(source, ())
        close = [f"tools.{source}.{n}" for n in difflib.get_close_matches(name, tools, 3, 0.6)]
    guess = f" Did you mean {' or '.join(close)}?" if close else ""
    return f".{guess} describe_tools(query=...) finds a tool by what it does."


def _line(e: MontyRuntimeError | MontySyntaxError) -> str:
    """The " (line N)" suffix naming the innermost frame in the agent's code, if any."""
    # Frames from exec()/eval() strings are "<string>"; the agent's code is "<python-input-N>".
    frames = [f for f in e.traceback() if f.filename.startswith("<python-input")]
    return f" (line {frames[-1].line})" if frames else ""
