"""The spec made executable: only declared edges, one write path, crash points on it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

import lockgate.spec as spec
from lockgate.machine.bindings import Facts, Guard, MachineBindings
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.faults import CrashMode, Faults, InjectedCrash
from lockgate.machine.machines import LifecycleMachine, build_machines
from lockgate.machine.records import Change, Record
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import CrashPoint
from tests.support.memory_store import MemoryStore

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def make_path(faults: Faults | None = None, *, conservative: bool = False) -> WritePath:
    return WritePath(MemoryStore(), faults=faults, clock=lambda: NOW, conservative=conservative)


def stored(path: WritePath, machine: str, record_id: str, status: str, **fields: object) -> Record:
    record = Record(machine=machine, id=record_id, status=status, fields=dict(fields))
    assert isinstance(path.store, MemoryStore)
    path.store.insert(record)
    return record


def test_machines_have_only_the_spec_edges() -> None:
    machines = build_machines()
    # transitions' auto transitions (to_<state>) would bypass the spec: they must not exist.
    with pytest.raises(IllegalTransition):
        machines["execution"].decide("e1", "pending", "to_completed", Facts(now=NOW))
    with pytest.raises(IllegalTransition, match="'complete' is not a transition the spec"):
        machines["execution"].decide("e1", "pending", "complete", Facts(now=NOW))


def test_records_with_equal_facts_decided_on_many_threads_each_get_their_edge() -> None:
    # The server and the simulator decide on worker threads, all with the same machines. Two
    # records in the same status with the same facts must not see each other's decision.
    machine = build_machines()["execution"]
    facts = Facts(now=NOW)
    start = threading.Barrier(8)

    def decide_many(thread: int) -> set[str]:
        start.wait()
        return {machine.decide(f"e{thread}", "pending", "start", facts).dest for _ in range(500)}

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set().union(*pool.map(decide_many, range(8))) == {"running"}


def _flag_bindings(machine: spec.MachineSpec) -> MachineBindings:
    def reads(name: str) -> Guard:
        return lambda f: bool(f.given.get(name, False))

    return MachineBindings(guards={g: reads(g) for g in machine.guard_names()}, effects={})


@pytest.mark.parametrize("machine", list(spec.MACHINES.values()), ids=lambda m: m.name)
def test_every_declared_edge_is_taken_when_its_guards_hold(machine: spec.MachineSpec) -> None:
    decider = LifecycleMachine(machine, _flag_bindings(machine))
    for t in machine.transitions:
        given = {**{g: True for g in t.conditions}, **{g: False for g in t.unless}}
        for source in t.source:
            chosen = decider.decide("r", source, t.event, Facts(now=NOW, given=given))
            assert (chosen.event, chosen.dest) == (t.event, t.dest)
        for g in t.conditions:
            with pytest.raises(GuardRefused):
                decider.decide("r", t.source[0], t.event, Facts(now=NOW, given={**given, g: False}))


def test_apply_moves_the_record_and_runs_the_effects_in_the_same_write() -> None:
    path = make_path()
    record = stored(path, "execution", "e1", "pending")
    path.apply(Step(record, "start", {"owner": "instance-1"}))
    deadline = NOW + timedelta(hours=24)
    path.apply(Step(record, "pause", {"snapshot": b"snap", "deadline": deadline}))
    row = path.store.get("execution", "e1")  # type: ignore[attr-defined]
    assert row.status == "waiting_for_interaction" and row.version == 2
    assert row.fields == {"owner": None, "snapshot": b"snap", "deadline": deadline}
    assert (record.status, record.version) == (row.status, row.version)


def test_undeclared_event_is_refused_naming_both_states() -> None:
    path = make_path()
    record = stored(path, "execution", "e1", "completed")
    with pytest.raises(IllegalTransition) as info:
        path.apply(Step(record, "start", {"owner": "i"}))
    assert info.value.source == "completed" and info.value.code == "illegal_transition"


def test_the_store_itself_refuses_an_undeclared_pair() -> None:
    store = MemoryStore()
    store.insert(Record("execution", "e1", "pending"))
    bypass = Change("execution", "e1", "start", "pending", "completed", 0, {})
    with pytest.raises(IllegalTransition, match=r"'start' to 'completed' .* from 'pending'"):
        store.commit([bypass])
    assert store.get("execution", "e1").status == "pending"


def test_a_writer_that_lost_the_race_gets_a_conflict() -> None:
    path = make_path()
    first = stored(path, "execution", "e1", "pending")
    second = Record("execution", "e1", "pending")  # read before the first writer committed
    path.apply(Step(first, "start", {"owner": "a"}))
    with pytest.raises(Conflict) as info:
        path.apply(Step(second, "start", {"owner": "b"}))
    assert info.value.code == "conflict"
    assert path.store.get("execution", "e1").fields["owner"] == "a"  # type: ignore[attr-defined]


def test_a_joint_step_commits_all_records_or_none() -> None:
    path = make_path()
    execution = stored(path, "execution", "e1", "running", owner="a")
    call = stored(path, "tool_call", "e1/1", "requested")
    stale = Record("tool_call", "e1/1", "requested", version=7)
    with pytest.raises(Conflict):
        path.apply(
            Step(execution, "pause", {"snapshot": b"s", "deadline": NOW}),
            Step(stale, "request_approval", {"arguments_preview": {}}),
        )
    assert path.store.get("execution", "e1").status == "running"  # type: ignore[attr-defined]
    path.apply(
        Step(execution, "pause", {"snapshot": b"s", "deadline": NOW}),
        Step(call, "request_approval", {"arguments_preview": {"key": "a"}}),
    )
    assert [p.event for p in path.store.history] == ["pause", "request_approval"]  # type: ignore[attr-defined]


def test_recovery_guards_choose_requeue_or_interrupt() -> None:
    path = make_path()
    safe = stored(path, "execution", "e1", "running", owner="dead")
    path.apply(Step(safe, "requeue"))
    assert safe.status == "pending"
    unsafe = stored(path, "execution", "e2", "running", owner="dead")
    with pytest.raises(GuardRefused):
        path.apply(Step(unsafe, "requeue", {"unsafe_in_doubt": True}))
    path.apply(Step(unsafe, "interrupt", {"unsafe_in_doubt": True, "what_ran": ["1"]}))
    assert unsafe.status == "interrupted"

    conservative = make_path(conservative=True)
    record = stored(conservative, "execution", "e3", "running", owner="dead")
    with pytest.raises(GuardRefused):
        conservative.apply(Step(record, "requeue"))


def test_deadline_guard_reads_the_stored_deadline() -> None:
    path = make_path()
    late = stored(path, "execution", "e1", "waiting_for_interaction", deadline=NOW)
    with pytest.raises(GuardRefused):
        path.apply(Step(late, "resume", {"owner": "a"}))
    path.apply(Step(late, "expire"))
    assert late.status == "expired"


def _dispatch_setup(faults: Faults) -> tuple[WritePath, Record, list[str]]:
    path = make_path(faults)
    call = stored(path, "tool_call", "e1/1", "approved")
    return path, call, []


def _effect(calls: list[str]) -> Callable[[], str]:
    def run() -> str:
        calls.append("called")
        return "result"

    return run


@pytest.mark.parametrize(
    ("phase", "committed", "effect_ran"),
    [("before_commit", False, False), ("after_commit", True, False), ("after_effect", True, True)],
)
def test_crash_points_of_an_intent_first_effect(
    phase: str, committed: bool, effect_ran: bool
) -> None:
    point = CrashPoint.parse(f"tool_call:dispatch:approved->dispatched:{phase}")
    path, call, calls = _dispatch_setup(Faults([point]))
    with pytest.raises(InjectedCrash) as info:
        path.apply(Step(call, "dispatch"), effect=_effect(calls))
    assert info.value.point == point
    assert (path.store.get("tool_call", "e1/1").status == "dispatched") is committed  # type: ignore[attr-defined]
    assert (calls == ["called"]) is effect_ran


def test_crash_after_an_effect_first_write_leaves_it_uncommitted() -> None:
    point = CrashPoint.parse("owed_request:answer:owed->answered:after_effect")
    path = make_path(Faults([point]))
    owed = stored(path, "owed_request", "s1/7", "owed")
    calls: list[str] = []
    with pytest.raises(InjectedCrash):
        path.apply(Step(owed, "answer"), effect=_effect(calls))
    assert calls == ["called"]
    assert path.store.get("owed_request", "s1/7").status == "owed"  # type: ignore[attr-defined]


def test_an_injected_crash_is_not_an_ordinary_exception() -> None:
    point = CrashPoint.parse("execution:start:pending->running:before_commit")
    path = make_path(Faults([point]))
    record = stored(path, "execution", "e1", "pending")
    with pytest.raises(InjectedCrash):
        try:
            path.apply(Step(record, "start", {"owner": "a"}))
        except Exception:  # what engine code catches must never swallow a simulated death
            pytest.fail("InjectedCrash was caught as an Exception")


def test_faults_record_every_point_passed_and_replay_by_seed() -> None:
    faults = Faults()
    path = make_path(faults)
    record = stored(path, "execution", "e1", "pending")
    path.apply(Step(record, "start", {"owner": "a"}))
    assert sorted(p.phase for p in faults.hits) == ["after_commit", "before_commit"]

    def fired(seed: int) -> list[CrashPoint]:
        faults = Faults(seed=seed, probability=0.5)
        for point in spec.crash_points(spec.EXECUTION):
            with contextlib.suppress(InjectedCrash):
                faults.reached(point)
        return faults.fired

    assert fired(7) == fired(7) and fired(7) != fired(8)


def test_faults_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "execution:start:pending->running:after_commit"
    monkeypatch.setenv("LOCKGATE_CRASH_AT", name)
    faults = Faults.from_environment()
    assert faults.mode is CrashMode.KILL and {p.name for p in faults.armed} == {name}
    monkeypatch.setenv("LOCKGATE_CRASH_AT", "nonsense")
    with pytest.raises(ValueError, match="not a crash point name"):
        Faults.from_environment()
