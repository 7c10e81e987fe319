"""The lifecycle spec as a Hypothesis state machine, run against the real engine.

`lifecycle_state_machine()` builds the rules from `spec.MACHINES`: one rule per (machine,
event) of the driven lifecycles (execution, tool_call, instance, session, owed_request: the
sessions and the ledger driven as the HTTP gate drives them, with the client's inbox), each
calling that event's
driver in `tests.support.harness.DRIVERS`, plus `crash_and_restart` (a crash point of the spec
armed around a client or operator action, the crashed instance booted again and recovering),
`restart` (a graceful restart) and `advance_clock`. Adding an event to the spec adds a rule,
and `test_every_spec_event_has_a_driver` fails until the event has a driver.

After every rule the harness lets pending work run (what the instances' workers do), then
replays the new transitions through the spec; the invariants below only read:

- the spec replay agrees with every stored status (the reference model);
- `simulation.invariants.check_all(..., quiescent=True)` finds nothing;
- every execution answered what its program gives for the decisions recorded on its calls
  (or ended expired, cancelled or interrupted).

A failure shrinks to a minimal sequence of rules (for at most `SHRINK_SECONDS`, well inside
the test's time limit, so it is always printed), printed with each draw, what the harness
did, the persisted history of the records involved and a `@reproduce_failure` blob.

How long it runs: `LOCKGATE_LIFECYCLE_PROFILE` = `ci` (the default: derandomized, so every run
explores the same sequences: 30 of up to 20 rules, about 30 s on two cores), `long`
(random sequences, about ten minutes) or `soak` (random, hours); random runs keep failures in
Hypothesis's example database and print a blob to replay them. For example

    LOCKGATE_LIFECYCLE_PROFILE=long .venv/bin/python -m pytest \
        tests/unit/test_generated_lifecycle.py
"""

from __future__ import annotations

import inspect
import os
import random
import shutil
import tempfile
import threading
import types
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as conjecture_engine
from hypothesis.stateful import (
    RULE_MARKER,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lockgate.machine.faults import Faults
from lockgate.machine.ledger import Ledger
from lockgate.machine.records import Record
from lockgate.machine.recovery import Recovery
from lockgate.machine.write_path import Applied, Step
from lockgate.simulation.invariants import history
from lockgate.simulation.world import World
from lockgate.spec import MACHINES, CrashPoint, MachineSpec, TransitionSpec
from lockgate.spec import ExecutionStatus as E
from tests.support.harness import (
    APPROVAL_TTL,
    DRIVERS,
    PRECONDITIONS,
    Choices,
    Driver,
    Harness,
    clean_restart,
    crash_anywhere,
    driven_events,
    missing_drivers,
    run_pausing,
)
from tests.support.spec_factories import with_transitions, without_transition

_COMMON: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}
PROFILES: Mapping[str, settings] = {
    "ci": settings(max_examples=30, stateful_step_count=20, derandomize=True, **_COMMON),
    "long": settings(max_examples=200, stateful_step_count=40, **_COMMON),
    "soak": settings(max_examples=5_000, stateful_step_count=60, **_COMMON),
}
PROFILE = os.environ.get("LOCKGATE_LIFECYCLE_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"LOCKGATE_LIFECYCLE_PROFILE={PROFILE!r}: choose one of {sorted(PROFILES)}")
#: pytest-timeout's limit for the generated test in each profile (0: none).
TIMEOUTS: Mapping[str, int] = {"ci": 300, "long": 3600, "soak": 0}
#: How long Hypothesis may shrink a failure before it prints the smallest found so far:
#: well inside the test's time limit, so a failure is always printed, never cut off.
SHRINK_SECONDS: Mapping[str, int] = {"ci": 90, "long": 600, "soak": 1800}


@pytest.fixture
def shrink_budget(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Bound Hypothesis's shrinking (its documented knob for this); the default is 300 s."""

    def bound(seconds: int) -> None:
        monkeypatch.setattr(conjecture_engine, "MAX_SHRINKING_SECONDS", seconds)

    return bound


def _scratch() -> str | None:
    """A memory-backed directory when there is one: the database fsyncs every commit."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def rule_name(machine: str, event: str) -> str:
    return f"{machine}__{event}"


class LifecycleRules(RuleBasedStateMachine):
    """The rules that do not come from a spec event, and the invariants."""

    machines: ClassVar[Mapping[str, MachineSpec]] = MACHINES

    def __init__(self) -> None:
        super().__init__()
        self.workdir = Path(tempfile.mkdtemp(prefix="lockgate-lifecycle-", dir=_scratch()))
        try:
            self.harness = Harness(self.workdir, machines=self.machines)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    def teardown(self) -> None:
        self.harness.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def step(self, driver: Driver, data: Choices) -> None:
        """One client or operator action, then what the background loops would do."""
        h = self.harness
        try:
            driver(h, data)
            h.settle()
        except Exception:
            note(h.report(["the step raised"]))
            raise

    @rule(data=st.data())
    def crash_and_restart(self, data: st.DataObject) -> None:
        self.step(crash_anywhere, data)

    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        self.step(clean_restart, data)

    @rule(delta=st.timedeltas(min_value=timedelta(0), max_value=2 * APPROVAL_TTL))
    def advance_clock(self, delta: timedelta) -> None:
        self.harness.advance(delta)
        self.harness.settle()

    @invariant()
    def spec_replay_agrees_with_the_database(self) -> None:
        disagreements = self.harness.model_disagreements()
        assert not disagreements, "the spec replay and the database disagree:\n" + (
            self.harness.report(disagreements)
        )

    @invariant()
    def simulation_invariants_hold(self) -> None:
        violations = self.harness.violations()
        records = [r for v in violations for r in v.records]
        assert not violations, "invariants violated:\n" + self.harness.report(
            [f"{v.invariant}: {v.detail}" for v in violations], records
        )

    @invariant()
    def every_answer_is_the_programs(self) -> None:
        wrong = self.harness.wrong_answers()
        assert not wrong, "wrong answers:\n" + self.harness.report(
            wrong, list(self.harness.executions)
        )


class MissingDriver(AssertionError):
    pass


def _event_rule(
    machine: str,
    name: str,
    drivers: Mapping[tuple[str, str], Driver],
    preconditions: Mapping[tuple[str, str], Callable[[Harness], bool]],
) -> Any:
    """The rule for one spec event: its driver, gated by the driver's precondition."""

    def fire(self: LifecycleRules, data: st.DataObject) -> None:
        driver = drivers.get((machine, name))
        if driver is None:
            raise MissingDriver(
                f"the spec event {machine}.{name} has no driver: add one to DRIVERS in "
                "tests/support/harness.py"
            )
        self.step(driver, data)

    fire.__name__ = rule_name(machine, name)
    fire.__doc__ = f"Make {machine}.{name} happen through its driver."
    ready = preconditions.get((machine, name))
    if ready is not None:
        fire = precondition(lambda self: ready(self.harness))(fire)
    return rule(data=st.data())(fire)


def lifecycle_state_machine(
    machines: Mapping[str, MachineSpec] = MACHINES,
    drivers: Mapping[tuple[str, str], Driver] = DRIVERS,
    preconditions: Mapping[tuple[str, str], Callable[[Harness], bool]] = PRECONDITIONS,
) -> type[LifecycleRules]:
    """A state machine class with one rule per event of the driven lifecycles of `machines`."""
    namespace: dict[str, object] = {"machines": machines}
    for machine, name in driven_events(machines):
        namespace[rule_name(machine, name)] = _event_rule(machine, name, drivers, preconditions)
    return types.new_class(
        "GeneratedLifecycle", (LifecycleRules,), exec_body=lambda ns: ns.update(namespace)
    )


def _rule_names(cls: type[RuleBasedStateMachine]) -> set[str]:
    """The names of the class's Hypothesis rules (what Hypothesis itself collects)."""
    return {name for name, f in inspect.getmembers(cls) if hasattr(f, RULE_MARKER)}


# -- the generated test ------------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUTS[PROFILE])
def test_the_spec_as_a_state_machine(shrink_budget: Callable[[int], None]) -> None:
    shrink_budget(SHRINK_SECONDS[PROFILE])
    run_state_machine_as_test(lifecycle_state_machine(), settings=PROFILES[PROFILE])


# -- the spec drives the rules -----------------------------------------------------------------


def test_every_spec_event_has_a_driver() -> None:
    missing = missing_drivers()
    assert missing == [], (
        "these spec events have no driver: "
        + ", ".join(f"{m}.{e}" for m, e in missing)
        + ". Add a driver for each to DRIVERS in tests/support/harness.py: a function that does "
        "what a client or an operator would do to make the event happen."
    )


SNOOZE = TransitionSpec(
    event="snooze",
    source=(E.WAITING_FOR_INTERACTION,),
    dest=E.WAITING_FOR_INTERACTION,
    description="A planted event: push the approval deadline back.",
)


def test_a_spec_change_changes_the_rules() -> None:
    planted = {**MACHINES, "execution": with_transitions(MACHINES["execution"], SNOOZE)}
    removed = {**MACHINES, "tool_call": without_transition(MACHINES["tool_call"], "block")}

    assert "execution__snooze" not in _rule_names(lifecycle_state_machine())
    assert "execution__snooze" in _rule_names(lifecycle_state_machine(planted))
    assert "tool_call__block" not in _rule_names(lifecycle_state_machine(removed))
    assert _rule_names(lifecycle_state_machine()) == {
        rule_name(m, e) for m, e in driven_events()
    } | {"crash_and_restart", "restart", "advance_clock"}
    assert missing_drivers(planted) == [("execution", "snooze")]

    state = lifecycle_state_machine(planted)()
    try:
        with pytest.raises(MissingDriver, match=r"execution\.snooze .*tests/support/harness\.py"):
            state.execution__snooze(data=None)  # type: ignore[attr-defined]
    finally:
        state.teardown()


# -- each driver does its job ------------------------------------------------------------------


@pytest.mark.parametrize("choices", ["first", "seeded"])
@pytest.mark.parametrize(("machine", "name"), sorted(DRIVERS))
def test_each_driver_makes_its_event_happen(machine: str, name: str, choices: str) -> None:
    """With a paused execution to act on, every choice a driver can make leads to its event
    (here: the first of each, and a seeded random walk)."""
    data: Choices = None if choices == "first" else random.Random(f"{machine}.{name}")
    workdir = Path(tempfile.mkdtemp(prefix="lockgate-driver-", dir=_scratch()))
    try:
        with Harness(workdir) as h:
            run_pausing(h, None)
            h.settle()
            h.observed.clear()
            DRIVERS[machine, name](h, data)
            h.settle()
            assert (machine, name) in h.observed, h.report([f"no {machine}.{name}"])
            assert not h.model_disagreements()
            assert not h.violations()
            assert not h.wrong_answers()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- a planted bug is found --------------------------------------------------------------------


def _never_marks_in_doubt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recovery that forgets to mark a dispatched, non-repeatable call in doubt: its
    mark_in_doubt step is dropped from whatever recovery writes."""
    original: Callable[[Recovery, Any], E] = Recovery.recover_execution

    def recover_execution(self: Recovery, row: Any) -> E:
        write = self.write
        apply = write.apply

        def skip_mark(*steps: Step, **kwargs: Any) -> Applied[Any]:
            kept = [s for s in steps if s.event != "mark_in_doubt"]
            return apply(*kept, **kwargs) if kept else Applied((), ())

        monkeypatch.setattr(write, "apply", skip_mark)
        try:
            return original(self, row)
        finally:
            monkeypatch.setattr(write, "apply", apply)

    monkeypatch.setattr(Recovery, "recover_execution", recover_execution)


def test_a_planted_recovery_bug_is_found(
    monkeypatch: pytest.MonkeyPatch, shrink_budget: Callable[[int], None]
) -> None:
    """Found, shrunk within its budget, and printed: the steps that fail, the draws they
    made, and the blob that replays them."""
    _never_marks_in_doubt(monkeypatch)
    shrink_budget(30)
    quick = settings(
        PROFILES["ci"],
        max_examples=60,
        stateful_step_count=10,
        phases=[Phase.generate, Phase.shrink],
    )
    with pytest.raises(AssertionError, match=r"left in flight|in doubt") as failed:
        run_state_machine_as_test(lifecycle_state_machine(), settings=quick)
    printed = "\n".join(getattr(failed.value, "__notes__", []))
    assert "state = GeneratedLifecycle()" in printed, printed
    assert "(crash point): CrashPoint(" in printed, printed
    assert "@reproduce_failure(" in printed, printed


def test_a_planted_ledger_bug_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness drives sessions and the ledger too: a session that ends without settling
    its uncollected reports (and no recovery to make up for it) leaves ids lost forever."""
    monkeypatch.setattr(Ledger, "abandon_steps", lambda self, session_id: [])
    monkeypatch.setattr(Ledger, "_abandon_ended", lambda self: 0)
    monkeypatch.setattr(Ledger, "lose", _lose_without_abandoning)
    quick = settings(
        PROFILES["ci"], max_examples=60, stateful_step_count=10, phases=[Phase.generate]
    )
    with pytest.raises(AssertionError, match=r"is still lost"):
        run_state_machine_as_test(lifecycle_state_machine(), settings=quick)


def _lose_without_abandoning(self: Ledger, owed: Record) -> None:
    self.write.apply(Step(owed, "lose"))


# -- what one process at a time cannot reach -------------------------------------------------


class _Gates(Faults):
    """Holds the named threads at one crash point until released (a stall, not a crash)."""

    def __init__(self, point: CrashPoint, threads: tuple[str, ...]) -> None:
        super().__init__()
        self.point = point
        self.arrived = {name: threading.Event() for name in threads}
        self.release = {name: threading.Event() for name in threads}

    def reached(self, point: CrashPoint) -> None:
        name = threading.current_thread().name
        if point == self.point and name in self.arrived and not self.arrived[name].is_set():
            self.arrived[name].set()
            self.release[name].wait(30)
        super().reached(point)


def test_a_stalled_instance_does_not_strand_what_its_successor_took_over(tmp_path: Path) -> None:
    """sim-a stalls just before the commit that would journal and send a write the policy
    approves; sim-b takes its execution over and reaches the same commit; sim-a wakes and
    is refused (its execution moved), and sim-b's run completes."""
    dispatch = CrashPoint("tool_call", "dispatch", "approved", "dispatched", "before_commit")
    gates = _Gates(dispatch, ("stalled", "successor"))
    world = World(tmp_path, faults=gates, settings={"policy": "notes.write=approve"})
    code = "tools.notes.write(key='k', text='v')\n'ok'"
    answers: dict[str, Any] = {}
    try:
        first = world.boot(name="sim-a")
        stalled = threading.Thread(
            target=lambda: answers.update(view=first.engine.execute("alice", code)),
            name="stalled",
        )
        stalled.start()
        assert gates.arrived["stalled"].wait(30)
        world.clock.advance(first.settings.lease_ttl + timedelta(seconds=1))
        successor = threading.Thread(
            target=lambda: answers.update(runtime=world.boot(name="sim-b")), name="successor"
        )
        successor.start()  # declares sim-a dead, requeues its execution and replays it ...
        assert gates.arrived["successor"].wait(30)
        gates.release["stalled"].set()  # ... while sim-a wakes up and tries to send the call
        stalled.join(30)
        gates.release["successor"].set()
        successor.join(30)
        survivor = answers["runtime"]
        survivor.maintain()
        survivor.engine.run_pending()
        view = survivor.engine.get(answers["view"].id, "alice")
        assert view.status == E.COMPLETED, history(survivor.engine.store.engine, [view.id])
    finally:
        for name in gates.release:
            gates.release[name].set()
        world.close()
