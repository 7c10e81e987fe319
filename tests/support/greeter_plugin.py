"""A tool source written as an operator would write their own (docs/sources.md, "Your own
Python tools"): the same interface as the built-in sources, loaded by a factory."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import Tool, ToolContext, ToolSpec


class Greet:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.spec = ToolSpec(
            source="greeter",
            name="greet",
            description="Greet someone by name",
            parameters={
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1}},
                "required": ["name"],
                "additionalProperties": False,
            },
            returns="str",
            idempotent=True,
            default_policy=PolicyDecision.APPROVE,
        )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return f"{self.greeting}, {arguments['name']}"


class GreeterSource:
    name = "greeter"

    def __init__(self, greeting: str) -> None:
        self._tools = [Greet(greeting)]

    def tools(self) -> Sequence[Tool]:
        return self._tools


def make_source(greeting: str = "hello") -> GreeterSource:
    return GreeterSource(greeting)


def not_a_source() -> object:
    return object()
