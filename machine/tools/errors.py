"""The errors of tools: a tool's own expected failure, and the ones Lockgate raises about them.

`ToolFailed` belongs to agent code (it sees it raised at the call); the others are
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
