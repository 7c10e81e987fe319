"""`tools.gate.hold()`: a test tool that returns only once the test opens its gate.

Shared by the tests that need a tool call to be in flight at a moment they choose (the drain,
the HTTP runner's response budget), instead of timing it with sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolSpec

#: A bound on a test that never opens the gate (a test bug), not a way to order events.
GATE_LIMIT_SECS = 60.0


@dataclass
class Gate:
    """Auto-approved and idempotent; counts its calls and signals when one is held."""

    opened: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    calls: int = 0

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            source="gate",
            name="hold",
            description="Waits until the test opens the gate.",
            returns="str",
            idempotent=True,
            default_policy=PolicyDecision.APPROVE,
        )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        self.calls += 1
        self.entered.set()
        if not self.opened.wait(GATE_LIMIT_SECS):
            raise RuntimeError("the test never opened the gate")
        return "opened"


@dataclass
class GateSource:
    gate: Gate
    name: str = "gate"

    def tools(self) -> Sequence[Tool]:
        return [self.gate]
