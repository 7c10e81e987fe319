"""A tool the harness holds in flight: `tools.held.wait()` returns only once the release file
exists.

A scenario that needs a request still in flight when something else happens (a DELETE of its
session) cannot rely on the request being slow: how long pure code runs depends on the
machine's load, and a request that finished first was never in flight. This tool makes the
order the harness's: the request stays in the tool until the harness creates the file, after
the event it is waiting for. A recovered execution calls it again (it is idempotent) and finds
the file there once the harness has released it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolSpec

SOURCE = "held"
#: Where the release file is named (serve.py passes it to the source).
RELEASE_ENV = "LOCKGATE_SIM_RELEASE_FILE"
#: A harness that never releases fails the call rather than hanging the server's worker.
MAX_HOLD_SECONDS = 60.0
#: How often the tool looks for the file: the order does not depend on it, only the latency.
POLL_SECONDS = 0.01

WAIT = ToolSpec(
    source=SOURCE,
    name="wait",
    description="Returns once the harness releases it (its release file exists).",
    returns="str",
    idempotent=True,
    default_policy=PolicyDecision.APPROVE,
)


@dataclass(frozen=True)
class _Wait:
    release: Path | None
    spec: ToolSpec = WAIT

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        if self.release is None:
            raise ToolFailed(f"the held tool needs {RELEASE_ENV}")
        deadline = time.monotonic() + MAX_HOLD_SECONDS
        while not self.release.exists():
            if time.monotonic() >= deadline:
                raise ToolFailed("the harness never released the held tool")
            time.sleep(POLL_SECONDS)
        return "released"


class HeldSource:
    """The `held` tools; the release file comes from the environment."""

    name = SOURCE

    def __init__(self, release: Path | None = None) -> None:
        named = os.environ.get(RELEASE_ENV)
        self._release = release if release is not None else (Path(named) if named else None)

    def tools(self) -> Sequence[Tool]:
        return [_Wait(self._release)]


def held_code() -> str:
    """Agent code whose request stays in flight until the harness releases it."""
    return "tools.held.wait()"
