"""The write path's merged and carried commits, over the in-memory reference store: a record
may take several steps in one transaction, and a call that may be made again is made at once,
its journal entry carried to the next commit of its execution. The spec decides which calls
may be carried: the write path refuses the rest before their tool runs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from lockgate.machine.errors import Conflict, GuardRefused
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.records import Record
from lockgate.machine.write_path import Carried, Step, WritePath
from lockgate.spec import CrashPoint
from tests.support.memory_store import MemoryStore

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
AT_ONCE = ("succeed_at_least_once", "fail_at_least_once")


def make_path(faults: Faults | None = None, *, conservative: bool = False) -> WritePath:
    return WritePath(MemoryStore(), faults=faults, clock=lambda: NOW, conservative=conservative)


def store_of(path: WritePath) -> MemoryStore:
    assert isinstance(path.store, MemoryStore)
    return path.store


def running(path: WritePath) -> Record:
    execution = Record("execution", "e1", "running", fields={"owner": "a"})
    store_of(path).insert(execution)
    return execution


def new_call(seq: int, *, idempotent: bool) -> Record:
    """A call's row as the dispatcher builds it: not stored yet, in its initial state."""
    return Record("tool_call", f"e1:{seq}", "requested", fields={"idempotent": idempotent})


def settle(call: Record) -> Callable[[str], Step]:
    def step(value: str) -> Step:
        return Step(call, "succeed_at_least_once", {"result": {"value": value}}, {"attempts": 1})

    return step


def tool(ran: list[str], value: str) -> Callable[[], str]:
    """A tool that notes that it ran and answers `value`."""

    def call() -> str:
        ran.append(value)
        return value

    return call


def test_a_record_takes_several_steps_in_one_commit() -> None:
    """A new call is checkpointed, inserted, approved and sent in one transaction."""
    path = make_path()
    execution = running(path)
    call = new_call(1, idempotent=False)
    ran: list[str] = []
    applied = path.apply(
        Step(execution, "checkpoint", {"snapshot": b"s1"}),
        Step(call, "auto_approve"),
        Step(call, "dispatch", data={"attempts": 1}),
        effect=tool(ran, "done"),
        inserts=[Record("tool_call", "e1:1", "requested", fields={"idempotent": False})],
        fence=execution,
    )
    assert ran == ["done"] and applied.effect_result == "done"
    stored = store_of(path).get("tool_call", "e1:1")
    assert (stored.status, stored.version) == ("dispatched", 2)
    assert (call.status, call.version) == ("dispatched", 2)
    assert [(p.event, p.version) for p in store_of(path).history] == [
        ("checkpoint", 1),
        ("auto_approve", 1),
        ("dispatch", 2),
    ]


def test_a_merged_commit_refused_by_its_fence_stores_nothing_and_sends_nothing() -> None:
    path = make_path()
    execution = running(path)
    stale = Record("execution", "e1", "running", version=execution.version)
    path.apply(Step(execution, "checkpoint", {"snapshot": b"s0"}))  # someone moved it
    call = new_call(1, idempotent=False)
    ran: list[str] = []
    with pytest.raises(Conflict):
        path.apply(
            Step(stale, "checkpoint", {"snapshot": b"s1"}),
            Step(call, "auto_approve"),
            Step(call, "dispatch"),
            effect=tool(ran, "sent"),
            inserts=[new_call(1, idempotent=False)],
            fence=stale,
        )
    assert ran == []
    assert [p.event for p in store_of(path).history] == ["checkpoint"]
    with pytest.raises(KeyError):
        store_of(path).get("tool_call", "e1:1")


def test_carried_calls_commit_with_the_next_step_of_their_execution() -> None:
    path = make_path()
    execution = running(path)
    carried = Carried()
    for seq in (1, 2):
        call = new_call(seq, idempotent=True)
        got = path.carry(
            carried, settle(call), AT_ONCE, lambda: "listed", inserts=[call], probe=call
        )
        assert got == "listed"
    assert store_of(path).history == []  # made, nothing committed yet
    path.apply(Step(execution, "complete", {"outcome": {"result": 2}}), carried=carried)
    assert (carried.steps, carried.inserts) == ([], [])
    assert [(p.record_id, p.event) for p in store_of(path).history] == [
        ("e1:1", "succeed_at_least_once"),
        ("e1:2", "succeed_at_least_once"),
        ("e1", "complete"),
    ]
    assert store_of(path).get("tool_call", "e1:2").fields["result"] == {"value": "listed"}


@pytest.mark.parametrize(
    ("idempotent", "conservative"), [(False, False), (True, True)], ids=["write", "retries-off"]
)
def test_a_call_that_may_not_be_made_again_is_refused_before_its_tool_runs(
    idempotent: bool, conservative: bool
) -> None:
    """Not idempotent, or retries off: the spec's guard refuses, and the tool never ran."""
    path = make_path(conservative=conservative)
    call = new_call(1, idempotent=idempotent)
    ran: list[str] = []
    carried = Carried()
    with pytest.raises(GuardRefused):
        path.carry(carried, settle(call), AT_ONCE, tool(ran, "x"), inserts=[call], probe=call)
    assert ran == [] and carried.steps == []


def test_an_event_that_writes_its_intent_first_is_not_carried() -> None:
    path = make_path()
    call = Record("tool_call", "e1:1", "approved", fields={"idempotent": True})
    ran: list[str] = []
    with pytest.raises(ValueError, match="'dispatch' does not run its effect before its commit"):
        path.carry(
            Carried(),
            lambda _: Step(call, "dispatch"),
            ("dispatch",),
            tool(ran, "sent"),
            probe=call,
        )
    assert ran == []


def test_a_crash_after_a_carried_call_ran_loses_its_entry() -> None:
    point = CrashPoint.parse("tool_call:succeed_at_least_once:requested->succeeded:after_effect")
    path = make_path(Faults([point]))
    running(path)
    call = new_call(1, idempotent=True)
    ran: list[str] = []
    with pytest.raises(InjectedCrash):
        path.carry(
            Carried(),
            settle(call),
            AT_ONCE,
            tool(ran, "listed"),
            inserts=[call],
            probe=call,
        )
    assert ran == ["listed"]
    assert store_of(path).history == []


def test_a_commit_waits_for_the_disk_unless_every_step_of_it_need_not() -> None:
    """The spec says which commits may return before the disk has them: an MCP request's
    bookkeeping (its owed entry and answer, its session's activity); one with any other
    step waits."""
    path = make_path()
    session = Record("session", "s1", "idle")
    store_of(path).insert(session)
    path.create("owed_request", Record("owed_request", "s1/7", "owed"))
    path.create("instance", Record("instance", "i1", "live"))
    path.apply(Step(session, "begin_request"))
    path.apply(Step(session, "end_request"))
    owed = Record("owed_request", "s1/8", "owed")
    store_of(path).insert(owed)
    path.apply(Step(owed, "answer"), effect=lambda: None)
    path.apply(Step(session, "begin_request"), Step(session, "close"))
    assert store_of(path).waited == [False, True, False, False, False, True]


def test_a_later_step_is_decided_on_what_the_earlier_ones_left() -> None:
    """The second step's guard reads a column the first step wrote in the same commit
    (here a deadline already past when the pause stores it)."""
    path = make_path()
    execution = running(path)
    past = NOW - timedelta(minutes=1)
    path.apply(
        Step(execution, "pause", {"snapshot": b"s", "deadline": past}), Step(execution, "expire")
    )
    stored = store_of(path).get("execution", "e1")
    assert (stored.status, stored.version, stored.fields["deadline"]) == ("expired", 2, past)


def test_a_refusal_after_the_tool_ran_is_not_one_a_caller_may_retry_another_way() -> None:
    """The events are checked before the tool runs; a step refused afterwards (its record
    is not the one checked) raises ValueError, never the GuardRefused on which a caller
    journals the call and makes it again."""
    path = make_path()
    checked = new_call(1, idempotent=True)
    other = new_call(2, idempotent=False)
    ran: list[str] = []
    with pytest.raises(ValueError, match="'succeed_at_least_once' was refused after its effect"):
        path.carry(Carried(), settle(other), AT_ONCE, tool(ran, "listed"), probe=checked)
    assert ran == ["listed"]


def test_a_call_settled_into_an_event_it_did_not_declare_is_refused() -> None:
    path = make_path()
    call = new_call(1, idempotent=True)
    with pytest.raises(
        ValueError,
        match=r"'fail_at_least_once' is not one of \['succeed_at_least_once'\]",
    ):
        path.carry(
            Carried(),
            lambda _: Step(call, "fail_at_least_once", {"result": {"error": "x"}}),
            ("succeed_at_least_once",),
            tool([], "listed"),
            probe=call,
        )


def test_observers_are_told_of_each_carried_step() -> None:
    path = make_path()
    seen: list[Step] = []
    path.carry_observers.append(seen.append)
    call = new_call(1, idempotent=True)
    path.carry(Carried(), settle(call), AT_ONCE, tool([], "listed"), inserts=[call], probe=call)
    assert [(s.record.id, s.event) for s in seen] == [("e1:1", "succeed_at_least_once")]
