"""The limits one sandboxed execution runs under, and how they map onto Monty's.

A dump carries the feed's limits and its elapsed execution time, so `max_duration_secs` bounds
the whole execution across resumes (the limits a resume passes are ignored); the tool-call
budget across steps is counted by `machine.sandbox_step`, since Monty's restarts at every load.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_monty import ResourceLimits

from lockgate.machine.values import limit_size


@dataclass(frozen=True)
class SandboxLimits:
    # Execution time of the whole run, summed over its steps; time spent waiting for tools
    # (or for approvals) does not count.
    max_duration_secs: float = 30.0
    max_memory_bytes: int = 256 * 1024 * 1024
    max_recursion_depth: int = 200
    # Tool calls over the whole execution. Within one step Monty also caps its own
    # suspensions (imports of tools, undefined names) at the same number.
    max_calls: int = 1000
    # The host-side watchdog: a worker silent for this long in one step is killed
    # (-> sandbox_crashed). None: max_duration_secs + 10, so the in-sandbox limit fires first.
    worker_timeout_secs: float | None = None
    max_output_bytes: int = 1024 * 1024
    max_log_chars: int = 100_000

    def __post_init__(self) -> None:
        for name in (
            "max_duration_secs",
            "max_memory_bytes",
            "max_recursion_depth",
            "max_calls",
            "max_log_chars",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive")
        if self.worker_timeout_secs is not None and self.worker_timeout_secs <= 0:
            raise ValueError("SandboxLimits.worker_timeout_secs must be positive")
        limit_size(None, self.max_output_bytes)  # rejects a max_output_bytes that is too small

    @property
    def worker_timeout(self) -> float:
        if self.worker_timeout_secs is not None:
            return self.worker_timeout_secs
        return self.max_duration_secs + 10.0

    def resource_limits(self) -> ResourceLimits:
        return ResourceLimits(
            max_feed_duration_secs=self.max_duration_secs,
            max_memory=self.max_memory_bytes,
            max_recursion_depth=self.max_recursion_depth,
            max_suspensions=self.max_calls,
        )
