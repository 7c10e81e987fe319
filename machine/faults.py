"""Crash points on the write path, armed by the simulator.

A `Faults` object is injected into the write path (never a process global), so each test
or simulation run owns its own, and a seeded random source makes a run replay exactly. A
production server has none: its write path passes no crash point and keeps no bookkeeping.
A server process is armed only when its `fault_injection` setting is on (the real-process
simulation sets it); the `LOCKGATE_CRASH_AT`-style variables alone arm nothing.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path

from lockgate.spec.crash_points import CrashPoint

log = logging.getLogger(__name__)


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


#: How long a held thread or its holder waits before the harness gives up: never a way to
#: order events (the gate does that), only a bound on a harness bug that would hang a run.
GATE_LIMIT_SECS = 60.0


class GateNeverOpened(BaseException):
    """A thread was held at a gate nobody opened within the limit: a harness bug."""


class Gate:
    """Holds the first thread that reaches `point` until the simulator opens the gate.

    This is how concurrency is simulated deterministically: instance A is stopped at a
    chosen point of its write path (as if its process stalled there), the simulator makes
    instance B do what it would meanwhile (recover A's work once A's lease lapsed), then
    opens the gate and A goes on with what it had read before the stall. One thread is held;
    any later passer goes through.
    """

    def __init__(self, point: CrashPoint) -> None:
        self.point = point
        #: Set when a thread arrived and is held (or when `give_up` says none will).
        self.arrived = threading.Event()
        self.held = False
        self._opened = threading.Event()

    def wait_until_held(self) -> bool:
        """True once a thread is held here; False if `give_up` was called first."""
        if not self.arrived.wait(GATE_LIMIT_SECS):
            raise GateNeverOpened(f"no thread reached {self.point.name}")
        return self.held

    def give_up(self) -> None:
        """The thread meant to arrive ended without passing the point: whoever passes it
        later (another incarnation, after a crash) goes through, never held by a gate its
        driver stopped watching."""
        self.arrived.set()
        self._opened.set()

    def open(self) -> None:
        self._opened.set()

    def hold(self) -> None:
        self.held = True
        self.arrived.set()
        if not self._opened.wait(GATE_LIMIT_SECS):
            raise GateNeverOpened(f"the gate at {self.point.name} was never opened")


class Faults:
    """Records every crash point the write path passes, fires the armed ones and holds
    threads at gated ones."""

    def __init__(
        self,
        armed: Iterable[CrashPoint] = (),
        *,
        mode: CrashMode = CrashMode.RAISE,
        seed: int | None = None,
        probability: float = 0.0,
        skip: int = 0,
        stops: Iterable[CrashPoint] = (),
        evidence: Path | None = None,
        record_trail: bool = True,
    ) -> None:
        self.armed = set(armed)
        #: Points at which the process stops itself (SIGSTOP), once each: a stalled process
        #: (a paused VM, a long GC) that the real-process simulation resumes with SIGCONT.
        self.stops = set(stops)
        #: A file the process appends what it did to (`reached`, `fired`, `stopped` and the
        #: point), so a simulator in another process knows the armed point really fired.
        self.evidence = evidence
        self.mode = mode
        self.random = random.Random(seed)
        self.probability = probability
        #: Passes over an armed point to let through before firing (crash on the n-th visit).
        self.skip = skip
        self.hits: Counter[CrashPoint] = Counter()
        #: Every point passed, in order (the in-process simulator reads what came after a
        #: crash). A long-lived armed server keeps none (`record_trail=False`): it grows with
        #: every heartbeat, and its evidence file already says which points it reached.
        self.record_trail = record_trail
        self.trail: list[CrashPoint] = []
        self.fired: list[CrashPoint] = []
        #: Where in `trail` each crash fired (the same point may be passed again later).
        self.fired_at: list[int] = []
        self._gates: dict[CrashPoint, Gate] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> Faults:
        """What the real-process simulation arms in a server it starts (read only when the
        server's `fault_injection` setting is on): `LOCKGATE_CRASH_AT` (points that SIGKILL
        the process), `LOCKGATE_STOP_AT` (points where it SIGSTOPs itself) and
        `LOCKGATE_FAULT_EVIDENCE` (the file it reports to); unset arms nothing."""

        def points(variable: str) -> list[CrashPoint]:
            names = [n.strip() for n in os.environ.get(variable, "").split(",") if n.strip()]
            return [CrashPoint.parse(n) for n in names]

        evidence = os.environ.get("LOCKGATE_FAULT_EVIDENCE")
        return cls(
            points("LOCKGATE_CRASH_AT"),
            mode=CrashMode.KILL,
            stops=points("LOCKGATE_STOP_AT"),
            evidence=Path(evidence) if evidence else None,
            record_trail=False,
        )

    def _report(self, what: str, point: CrashPoint, *, durable: bool) -> None:
        if self.evidence is None:
            return
        with open(self.evidence, "a", encoding="utf-8") as f:
            f.write(f"{what} {point.name} {os.getpid()}\n")
            if durable:  # the process dies or stops next: the line must be on disk first
                f.flush()
                os.fsync(f.fileno())

    def gate(self, point: CrashPoint) -> Gate:
        """Hold the next thread that reaches `point` (see `Gate`)."""
        gate = Gate(point)
        with self._lock:
            self._gates[point] = gate
        return gate

    def reached(self, point: CrashPoint) -> None:
        with self._lock:
            first = self.hits[point] == 0
            self.hits[point] += 1
            if self.record_trail:
                self.trail.append(point)
            gate = self._gates.pop(point, None)
            stop = point in self.stops
            self.stops.discard(point)
            if first:
                self._report("reached", point, durable=False)
        if gate is not None:
            gate.hold()
        if stop:
            # Paused holding no database transaction (see OpenTransactions): a process
            # stalled mid-transaction on SQLite would stop every other instance too.
            from lockgate.machine.db.connect import TRANSACTIONS

            with TRANSACTIONS.none_open():
                self._report("stopped", point, durable=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        with self._lock:
            if point in self.armed:
                if self.skip > 0:
                    self.skip -= 1
                    return
            elif not (self.probability and self.random.random() < self.probability):
                return
            self.fired.append(point)
            if self.record_trail:
                self.fired_at.append(len(self.trail) - 1)
            self.armed.discard(point)  # a point kills once: what comes after is the recovery
        if self.mode is CrashMode.KILL:
            self._report("fired", point, durable=True)
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedCrash(point)


#: The variables that arm a server process; ignored unless fault injection is switched on.
FAULT_VARIABLES = ("LOCKGATE_CRASH_AT", "LOCKGATE_STOP_AT", "LOCKGATE_FAULT_EVIDENCE")


def for_server(fault_injection: bool) -> Faults | None:
    """The faults a server process runs with: none unless its settings switch injection on.
    A fault variable left in a production environment is ignored, with a warning, rather
    than killing the server at a crash point."""
    if fault_injection:
        log.warning("fault injection is ON: this server obeys %s", ", ".join(FAULT_VARIABLES))
        return Faults.from_environment()
    ignored = [v for v in FAULT_VARIABLES if os.environ.get(v)]
    if ignored:
        log.warning(
            "ignoring %s: fault injection is off (LOCKGATE_FAULT_INJECTION is for the "
            "simulator only)",
            ", ".join(ignored),
        )
    return None
