"""A fixed number of slots shared fairly between principals, for threads.

Why it exists: the sandbox has a small pool of Monty workers that every principal shares.
Handed out first come, first served, one principal's long, CPU-bound executions could hold
every worker and leave everyone else's code waiting (an attacker test showed five busy
executions from one principal making another principal's one-line call answer `running`).
`FairSlots` bounds what one principal may hold at once (`per_principal`) and, when a slot
frees, gives it to the waiting principal that holds the fewest slots (ties: the one waiting
longest), so a busy principal can slow others down by at most its own share.

Engine work runs in worker threads, not on the event loop, so this is built on
`threading.Condition`: a waiter sleeps until it is handed a slot, nothing polls. A freed slot
is handed over directly (the releaser picks the next holder), so a thread arriving later
can never take a slot from the waiter it was meant for.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class _Waiter:
    principal: str
    #: Arrival order: among principals holding as many slots, the lowest goes first.
    order: int
    granted: bool = False


class FairSlots:
    """`capacity` slots; one principal holds at most `per_principal` of them at a time.

    `acquire(principal)` is a context manager: it blocks until the slot is this thread's and
    gives it back on exit, whatever the block raised.
    """

    def __init__(self, capacity: int, per_principal: int) -> None:
        if capacity < 1:
            raise ValueError("FairSlots capacity must be at least 1")
        if per_principal < 1:
            raise ValueError("FairSlots per_principal must be at least 1")
        self.capacity = capacity
        self.per_principal = min(per_principal, capacity)
        self._changed = threading.Condition()
        self._free = capacity
        self._held: dict[str, int] = {}
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @contextmanager
    def acquire(self, principal: str) -> Iterator[None]:
        self._take(principal)
        try:
            yield
        finally:
            self._give(principal)

    # -- what an observer (a test, a metric) may read ----------------------------------------

    def held(self, principal: str) -> int:
        """Slots `principal` holds now (including one just handed to a waking waiter)."""
        with self._changed:
            return self._held.get(principal, 0)

    def all_free(self) -> bool:
        """No slot is held and nobody waits for one."""
        with self._changed:
            return self._free == self.capacity and not self._waiting

    def waiting(self) -> list[str]:
        """The principals of the threads waiting for a slot, longest waiting first."""
        with self._changed:
            return [w.principal for w in self._waiting]

    def wait_for_waiting(self, count: int, timeout: float | None = None) -> bool:
        """Block until at least `count` threads are waiting (False if `timeout` passed)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._waiting) >= count, timeout)

    # -- the rules ---------------------------------------------------------------------------

    def _may_hold_more(self, principal: str) -> bool:
        return self._held.get(principal, 0) < self.per_principal

    def _grant(self, principal: str) -> None:
        self._free -= 1
        self._held[principal] = self._held.get(principal, 0) + 1

    def _take(self, principal: str) -> None:
        with self._changed:
            # Every free slot has already been handed to any waiter that may hold it (see
            # `_hand_over`), so a free slot here is one nobody waiting is allowed to take.
            if self._free > 0 and self._may_hold_more(principal):
                self._grant(principal)
                return
            me = _Waiter(principal, next(self._arrivals))
            self._waiting.append(me)
            self._changed.notify_all()  # for observers counting waiters
            try:
                while not me.granted:
                    self._changed.wait()
            except BaseException:
                # Interrupted while waiting: give back a slot handed over meanwhile, or
                # leave the queue, so nothing leaks.
                if me.granted:
                    self._release_locked(principal)
                else:
                    self._waiting.remove(me)
                raise

    def _give(self, principal: str) -> None:
        with self._changed:
            self._release_locked(principal)

    def _release_locked(self, principal: str) -> None:
        held = self._held.get(principal, 0)
        if held <= 0:
            raise RuntimeError(f"{principal!r} gave back a slot it did not hold")
        if held == 1:
            del self._held[principal]
        else:
            self._held[principal] = held - 1
        self._free += 1
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free slots to waiters: fewest slots held first, then longest waiting."""
        handed = False
        while self._free > 0:
            eligible = [w for w in self._waiting if self._may_hold_more(w.principal)]
            if not eligible:
                break
            chosen = min(eligible, key=lambda w: (self._held.get(w.principal, 0), w.order))
            self._waiting.remove(chosen)
            self._grant(chosen.principal)
            chosen.granted = True
            handed = True
        if handed:
            self._changed.notify_all()
