"""Tools agent code calls as `tools.<source>.<name>(...)`: the registry and built-in sources."""

from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.tools.registry import (
    NAMESPACE,
    InvalidArguments,
    InvalidToolSource,
    Tool,
    ToolContext,
    ToolFailed,
    ToolOutcomeUnknown,
    ToolRegistry,
    ToolSource,
    ToolSpec,
    UnknownTool,
    make_idempotency_key,
)

__all__ = [
    "NAMESPACE",
    "InvalidArguments",
    "InvalidToolSource",
    "NotesSource",
    "Tool",
    "ToolContext",
    "ToolFailed",
    "ToolOutcomeUnknown",
    "ToolRegistry",
    "ToolSource",
    "ToolSpec",
    "UnknownTool",
    "make_idempotency_key",
]
