"""What a sandbox step hands back: the `Step` it ended with, and what a tool call answers.

Plain values, so the engine, the dispatcher and the tests can name them without importing
Monty's worker machinery. `machine.sandbox` re-exports them all.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import JsonValue
from pydantic_monty import ExcType

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

# --- a step that did not end ----------------------------------------------------------------


class SandboxStopped(RuntimeError):
    """The step was cut off by `Sandbox.stop` (the server drains): it did not end, it was
    abandoned, and the engine hands its execution back from its last checkpoint. Never
    reaches a client, so it carries no error code."""

    def __init__(self) -> None:
        super().__init__("the sandbox was stopped while this step ran")
