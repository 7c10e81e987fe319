"""Crash points on the write path, armed by the simulator.

A `Faults` object is injected into the write path (never a process global), so each test
or simulation run owns its own, and a seeded random source makes a run replay exactly.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum

from spec.crash_points import CrashPoint


class InjectedCrash(BaseException):
    """The process 'dies' here. A BaseException so that no `except Exception` in the engine,
    and nothing in `transitions`, mistakes it for a failure it could handle: the write path
    triggers the crash points outside any `transitions` callback."""

    def __init__(self, point: CrashPoint) -> None:
        super().__init__(f"injected crash at {point.name}")
        self.point = point


class CrashMode(StrEnum):
    #: Raise `InjectedCrash` (in-process simulation).
    RAISE = "raise"
    #: SIGKILL the current process (real-process simulation).
    KILL = "kill"


class Faults:
    """Records every crash point the write path passes and fires the armed ones."""

    def __init__(
        self,
        armed: Iterable[CrashPoint] = (),
        *,
        mode: CrashMode = CrashMode.RAISE,
        seed: int | None = None,
        probability: float = 0.0,
        skip: int = 0,
    ) -> None:
        self.armed = set(armed)
        self.mode = mode
        self.random = random.Random(seed)
        self.probability = probability
        #: Passes over an armed point to let through before firing (crash on the n-th visit).
        self.skip = skip
        self.hits: Counter[CrashPoint] = Counter()
        #: Every point passed, in order (the simulator reads what came after a crash).
        self.trail: list[CrashPoint] = []
        self.fired: list[CrashPoint] = []

    @classmethod
    def from_environment(cls, variable: str = "LOCKGATE_CRASH_AT") -> Faults:
        """Arm the points named (comma-separated) in an environment variable, killing the
        process when one is reached; an unset variable arms nothing."""
        names = [n for n in os.environ.get(variable, "").split(",") if n.strip()]
        return cls([CrashPoint.parse(n.strip()) for n in names], mode=CrashMode.KILL)

    def reached(self, point: CrashPoint) -> None:
        self.hits[point] += 1
        self.trail.append(point)
        if point in self.armed:
            if self.skip > 0:
                self.skip -= 1
                return
        elif not (self.probability and self.random.random() < self.probability):
            return
        self.fired.append(point)
        self.armed.discard(point)  # a point kills once: what comes after is the recovery
        if self.mode is CrashMode.KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedCrash(point)
