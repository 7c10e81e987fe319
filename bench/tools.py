"""The benchmark's own tools: bodies that do nothing, so a figure is the journal's cost.

`bench.echo` is an auto-approved read (idempotent), `bench.record` a write that requires
approval; both answer their argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolSpec

_VALUE: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"value": {"type": "integer"}},
    "required": ["value"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class _Answer:
    spec: ToolSpec

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return arguments["value"]


ECHO = _Answer(
    ToolSpec(
        source="bench",
        name="echo",
        description="Answers its value (a read: auto-approved, idempotent).",
        parameters=_VALUE,
        returns="int",
        idempotent=True,
        default_policy=PolicyDecision.APPROVE,
    )
)
RECORD = _Answer(
    ToolSpec(
        source="bench",
        name="record",
        description="Answers its value (a write: requires approval).",
        parameters=_VALUE,
        returns="int",
        idempotent=False,
        default_policy=PolicyDecision.REQUIRE_APPROVAL,
    )
)


class BenchSource:
    name = "bench"

    def tools(self) -> Sequence[Tool]:
        return [ECHO, RECORD]


def reads(n: int) -> str:
    """Agent code making `n` auto-approved reads."""
    return f"total = 0\nfor i in range({n}):\n    total += tools.bench.echo(value=i)\ntotal"


def writes(n: int) -> str:
    """Agent code making `n` writes, each paused for approval."""
    return f"total = 0\nfor i in range({n}):\n    total += tools.bench.record(value=i)\ntotal"
