"""`tools.hold.until_open()`: a Python source for tests that drive `lockgate serve` processes
and need a call in flight, on a known instance, at the moment they choose (a kill), instead
of timing it against code that runs for a while and may finish first.

The call writes a marker naming the instance that runs it (`entered-<instance>-<n>`) into
the source's directory, then returns once the test creates the file `open` there. It is
idempotent and auto-approved: recovery of a killed instance's work goes on from the last
checkpoint and calls it again, which returns at once once the gate is open.

`tests/support/gate_tool.py` is its in-process twin (a `threading.Event` the test sets);
a `lockgate serve` process shares nothing with the test but files, hence the file."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import Tool, ToolContext, ToolSpec

#: A bound on a test that never opens the gate (a test bug), not a way to order events.
HOLD_LIMIT_SECS = 120.0
#: How often a held call looks for the `open` file (another process creates it).
LOOK_EVERY_SECS = 0.05

_markers = itertools.count()


def entered(directory: Path) -> list[str]:
    """The instances that have run the call so far, one entry per call (oldest first)."""
    marks = sorted(directory.glob("entered-*"), key=lambda p: p.stat().st_mtime_ns)
    return [m.name.removeprefix("entered-").rsplit("-", 1)[0] for m in marks]


def open_gate(directory: Path) -> None:
    (directory / "open").touch()


class UntilOpen:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.spec = ToolSpec(
            source="hold",
            name="until_open",
            description="Waits until the test opens the gate.",
            returns="str",
            idempotent=True,
            default_policy=PolicyDecision.APPROVE,
        )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        instance = os.environ.get("LOCKGATE_INSTANCE_NAME", "unnamed")
        (self.directory / f"entered-{instance}-{os.getpid()}.{next(_markers)}").touch()
        deadline = time.monotonic() + HOLD_LIMIT_SECS
        while not (self.directory / "open").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(LOOK_EVERY_SECS)  # polling a file another process creates
        return "opened"


class HoldSource:
    name = "hold"

    def __init__(self, directory: str) -> None:
        self._tools = [UntilOpen(Path(directory))]

    def tools(self) -> Sequence[Tool]:
        return self._tools


def make_source(directory: str) -> HoldSource:
    return HoldSource(directory)
