"""FairSlots with real threads: the per-principal cap, who gets a freed slot, no leaks.

Ordering comes from events and from `wait_for_waiting` (a condition the slots signal when a
thread starts waiting), never from sleeping. Every blocking wait has a timeout, so a broken
rule fails the test instead of hanging it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from lockgate.machine.fair_slots import FairSlots

#: Long enough for any thread here to be scheduled; only reached when a rule is broken.
TIMEOUT = 10.0


class Holder:
    """A thread that takes a slot for `principal`, holds it until `let_go`, then returns it."""

    def __init__(self, slots: FairSlots, principal: str, order: list[str] | None = None) -> None:
        self.slots, self.principal, self.order = slots, principal, order
        self.acquired = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.slots.acquire(self.principal):
            if self.order is not None:
                self.order.append(self.principal)
            self.acquired.set()
            self.release.wait(TIMEOUT)

    def start(self) -> Holder:
        self.thread.start()
        return self

    def holds(self) -> bool:
        return self.acquired.wait(TIMEOUT)

    def let_go(self) -> None:
        self.release.set()
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    """Threads a test started; all of them are let go at the end, whatever happened."""
    made: list[Holder] = []
    yield made
    for holder in made:
        holder.release.set()
    for holder in made:
        holder.thread.join(TIMEOUT)


def hold(holders: list[Holder], slots: FairSlots, principal: str) -> Holder:
    """A holder that has its slot."""
    holder = Holder(slots, principal).start()
    holders.append(holder)
    assert holder.holds(), f"{principal} did not get a free slot"
    return holder


def queue(
    holders: list[Holder], slots: FairSlots, principal: str, order: list[str] | None = None
) -> Holder:
    """A holder that is waiting for a slot (behind everyone queued before it)."""
    already = len(slots.waiting())
    holder = Holder(slots, principal, order).start()
    holders.append(holder)
    assert slots.wait_for_waiting(already + 1, TIMEOUT), f"{principal} never started waiting"
    assert not holder.acquired.is_set()
    return holder


def test_one_principal_never_holds_more_than_its_share(holders: list[Holder]) -> None:
    slots = FairSlots(capacity=3, per_principal=2)
    first, _ = hold(holders, slots, "alice"), hold(holders, slots, "alice")
    # A slot is free, but alice is at her cap: her third step waits...
    third = queue(holders, slots, "alice")
    assert slots.waiting() == ["alice"] and slots.held("alice") == 2
    # ...while bob gets the free slot at once.
    hold(holders, slots, "bob")
    assert slots.held("bob") == 1
    # When one of alice's steps ends, her waiting one goes on.
    first.let_go()
    assert third.holds()
    assert slots.held("alice") == 2 and slots.waiting() == []


def test_a_freed_slot_goes_to_the_principal_holding_fewer(holders: list[Holder]) -> None:
    slots = FairSlots(capacity=2, per_principal=2)
    first, second = hold(holders, slots, "alice"), hold(holders, slots, "alice")
    alice_next = queue(holders, slots, "alice")  # waiting longest
    bob = queue(holders, slots, "bob")
    first.let_go()
    # alice still holds one, bob none: the slot is bob's although alice waited longer.
    assert bob.holds()
    assert not alice_next.acquired.is_set() and slots.waiting() == ["alice"]
    second.let_go()
    assert alice_next.holds()
    assert slots.held("alice") == 1 and slots.held("bob") == 1


def test_principals_holding_as_many_are_served_in_arrival_order(holders: list[Holder]) -> None:
    slots = FairSlots(capacity=1, per_principal=1)
    blocker = hold(holders, slots, "zed")
    order: list[str] = []
    waiters = [queue(holders, slots, name, order) for name in ("carol", "dave", "erin")]
    assert slots.waiting() == ["carol", "dave", "erin"]
    blocker.let_go()
    for waiter in waiters:
        assert waiter.holds()
        waiter.let_go()  # hands the slot to the next one
    assert order == ["carol", "dave", "erin"]


def test_one_principals_own_steps_are_served_in_arrival_order(holders: list[Holder]) -> None:
    slots = FairSlots(capacity=2, per_principal=1)
    blocker = hold(holders, slots, "alice")
    order: list[str] = []
    early = queue(holders, slots, "alice", order)
    late = queue(holders, slots, "alice", order)
    blocker.let_go()
    assert early.holds() and not late.acquired.is_set()
    early.let_go()
    assert late.holds()


def test_an_exception_gives_the_slot_back() -> None:
    slots = FairSlots(capacity=2, per_principal=1)
    for _ in range(3):  # more times than there are slots: nothing leaked
        with pytest.raises(ValueError), slots.acquire("alice"):
            raise ValueError("the step failed")
        assert slots.held("alice") == 0
    with slots.acquire("alice"), slots.acquire("bob"):
        assert slots.held("alice") == 1 and slots.held("bob") == 1


def test_a_slot_freed_by_an_exception_goes_to_the_waiter(holders: list[Holder]) -> None:
    slots = FairSlots(capacity=1, per_principal=1)
    entered, fail = threading.Event(), threading.Event()

    def failing_step() -> None:
        with slots.acquire("alice"):
            entered.set()
            fail.wait(TIMEOUT)
            raise RuntimeError("the sandbox crashed")

    errors: list[BaseException] = []
    thread = threading.Thread(
        target=lambda: _record(errors, failing_step), name="failing-step", daemon=True
    )
    thread.start()
    assert entered.wait(TIMEOUT)
    bob = queue(holders, slots, "bob")
    fail.set()
    assert bob.holds()
    thread.join(TIMEOUT)
    assert [type(e) for e in errors] == [RuntimeError]


def _record(errors: list[BaseException], step: Callable[[], None]) -> None:
    try:
        step()
    except BaseException as exc:
        errors.append(exc)


def test_many_threads_never_exceed_either_bound() -> None:
    slots = FairSlots(capacity=3, per_principal=2)
    principals = ["alice", "bob", "carol", "dave"]
    rounds, per_principal_threads = 50, 3
    start = threading.Barrier(len(principals) * per_principal_threads)
    lock = threading.Lock()
    now: dict[str, int] = dict.fromkeys(principals, 0)
    worst = {"total": 0, "one": 0}

    def worker(principal: str) -> None:
        start.wait(TIMEOUT)
        for _ in range(rounds):
            with slots.acquire(principal):
                with lock:
                    now[principal] += 1
                    worst["one"] = max(worst["one"], now[principal])
                    worst["total"] = max(worst["total"], sum(now.values()))
                with lock:
                    now[principal] -= 1

    threads = [
        threading.Thread(target=worker, args=(p,), daemon=True)
        for p in principals
        for _ in range(per_principal_threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a thread never got its slots"
    assert worst["total"] <= 3 and worst["one"] <= 2
    assert all(slots.held(p) == 0 for p in principals) and slots.waiting() == []


def test_bounds_are_checked() -> None:
    for capacity, per_principal, which in ((0, 1, "capacity"), (1, 0, "per_principal")):
        with pytest.raises(ValueError) as refused:
            FairSlots(capacity, per_principal)
        assert str(refused.value) == f"FairSlots {which} must be at least 1"
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        FairSlots(-1, 2)
    # A share larger than the pool is the pool.
    assert FairSlots(capacity=2, per_principal=5).per_principal == 2
