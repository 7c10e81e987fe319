"""The errors of tools: a tool's own expected failure, and the ones Lockgate raises about them.

`ToolFailed` belongs to agent code (it sees it raised at the call), and `ToolOutcomeUnknown`
says a call was sent and its answer lost (the engine leaves a write in doubt); the others are
`LockgateError`s with stable codes: a call to a tool that does not exist, arguments that do
not fit the tool's schema, and a source or tool definition that cannot be served.
"""

from __future__ import annotations

from collections.abc import Sequence

from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.tools.spec import NAMESPACE


class ToolFailed(Exception):
    """An expected failure of the tool itself (a missing note, a rejected request).

    Not a LockgateError: it belongs to the agent code, which sees it raised at the call and
    may catch it. Messages must not contain secrets; the engine still redacts them.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolOutcomeUnknown(ToolFailed):
    """The call was sent and its answer lost (the connection closed, or no answer came
    within the bound): whether it took effect is unknown.

    A tool raises it only once the request may have reached the other side; a request that
    surely was not sent is a `ToolFailed`. The engine treats it as it treats a call whose
    instance died after dispatching it: a call that may be made again (an idempotent tool)
    fails with this message, as a `ToolFailed` would; any other call is left in doubt and
    its execution ends interrupted, naming it. The message says what was lost, never a
    secret (the engine still redacts it); `failure`, what the call says when it is only a
    failure (a read's lost answer), is the message unless given.
    """

    def __init__(self, message: str, *, failure: str | None = None) -> None:
        super().__init__(message)
        self.failure = message if failure is None else failure


class UnknownTool(LockgateError):
    code = ErrorCode.UNKNOWN_TOOL

    def __init__(self, *, name: str, suggestions: Sequence[str], discovery_hint: str) -> None:
        self.name, self.suggestions = name, tuple(suggestions)
        guess = f"Did you mean {', '.join(self.suggestions)}? " if self.suggestions else ""
        super().__init__(f"there is no tool {name!r}", hint=guess + discovery_hint)


class InvalidArguments(LockgateError):
    code = ErrorCode.INVALID_ARGUMENTS

    def __init__(self, *, tool: str, problems: Sequence[str], usage: str) -> None:
        self.tool, self.problems = tool, tuple(problems)
        super().__init__(f"{NAMESPACE}.{tool}: {'; '.join(self.problems)}", hint=usage)


class InvalidToolSource(LockgateError):
    """A source or tool definition Lockgate cannot serve (a programming error at start-up)."""

    code = ErrorCode.INVALID_INPUT
