"""The in-process sweep: every scenario, crashed at every crash point it reaches.

For each scenario the sweep first runs it without faults and records the crash points it
passes. Each point becomes a plan: run the scenario again with that point armed; when it
fires, the process "dies" (everything in memory is dropped), a new incarnation boots on the
same database and recovers, and the client goes on as it would. Points reached only during
that recovery (requeue, interrupt, mark_in_doubt, ...) become plans of their own: the first
crash, then a second one inside the recovery. After each run the invariants are checked on
what was persisted.
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.simulation.invariants import CallLists, Violation, calls_made, check_all, history
from lockgate.simulation.people_invariants import check_people
from lockgate.simulation.scenarios import CATALOG, Scenario, ScenarioFailed
from lockgate.simulation.webhook_invariants import check_webhooks
from lockgate.simulation.world import CANARY, Client, LogCapture, World, scratch_dir
from lockgate.spec import MACHINES, CrashPoint, every_crash_point

#: Crash plans go this deep: a crash, then one crash during its recovery.
MAX_DEPTH = 2
#: A client gives up after this many restarts in one run (each armed point fires once, so a
#: run crashes at most MAX_DEPTH times; more would be a bug in the sweep).
MAX_ATTEMPTS = MAX_DEPTH + 2
#: The lifecycles the catalog drives (the coverage gate covers every crash point of these).
DRIVEN_MACHINES = (
    "execution",
    "tool_call",
    "session",
    "owed_request",
    "instance",
    "webhook_delivery",
    "approver_session",
    "enrolment",
)


@dataclass
class RunResult:
    scenario: str
    plan: tuple[CrashPoint, ...]
    fired: list[CrashPoint]
    #: Points passed after the last crash (candidates for a deeper plan).
    after_last_crash: list[CrashPoint]
    reached: set[CrashPoint]
    violations: list[Violation]
    trace: list[str]
    #: The calls every execution made (a crash-free run's are the baseline of the others).
    calls: CallLists = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def reproduce(self) -> str:
        points = ",".join(p.name for p in self.plan)
        crash = f" --crash-at '{points}'" if points else ""
        return f"lockgate simulate --scenario {self.scenario}{crash}"


def run_plan(
    scenario: Scenario,
    plan: Sequence[CrashPoint],
    workdir: Path,
    database_url: str | None = None,
    baseline: CallLists | None = None,
) -> RunResult:
    """Run one scenario with `plan` armed; check the invariants afterwards (with the calls
    of the scenario's crash-free run as `baseline`, for checkpoint fidelity)."""
    faults = Faults(plan)
    world = World(
        workdir,
        database_url,
        settings=scenario.settings,
        faults=faults,
        over_http=scenario.over_http,
    )
    capture = LogCapture()
    root = logging.getLogger()
    root.addHandler(capture)
    previous_level = root.level
    root.setLevel(logging.DEBUG)
    trace: list[str] = []
    violations: list[Violation] = []
    made: CallLists = {}

    def restart() -> Runtime:
        """The process died: drop everything it held and boot a new incarnation (whose boot
        recovery may itself be crashed by a deeper plan)."""
        for _ in range(MAX_ATTEMPTS):
            for runtime in list(world.runtimes):
                world.abandon(runtime)
            trace.append("restart: boot sim-a (new incarnation, recovers on boot)")
            try:
                return world.boot()
            except InjectedCrash as again:
                trace.append(f"CRASH during recovery at {again.point.name}")
        raise RuntimeError("the sweep crashed more often than its plan allows")

    def settle(client: Client) -> None:
        # Let whatever recovery requeued run, as the live instance's worker would (a new
        # incarnation if the scenario stopped its instance).
        client.runtime.maintain()
        if client.runtime.fenced.is_set():
            trace.append("boot sim-a to settle")
            client.runtime = world.boot()
        client.runtime.engine.run_pending()
        # Then let time pass beyond every session's cap: no session may outlive it.
        policy = client.runtime.sessions.policy
        world.clock.advance(policy.cap + policy.idle_timeout)
        client.runtime.maintain()

    try:
        client: Client | None = None
        for step in ("drive", "settle"):
            for _attempt in range(MAX_ATTEMPTS):
                try:
                    if client is None:
                        trace.append("boot sim-a")
                        client = Client(world, world.boot())
                    trace.append(f"client drives {scenario.name}" if step == "drive" else step)
                    if step == "drive":
                        scenario.drive(client)
                        trace.append("client done")
                    else:
                        settle(client)
                    break
                except InjectedCrash as crash:
                    trace.append(f"CRASH at {crash.point.name}")
                    if client is None:
                        for runtime in list(world.runtimes):
                            world.abandon(runtime)
                    else:
                        client.runtime = restart()
            else:
                violations.append(Violation("the client finishes", f"{step} never ended"))
        if client is not None:
            engine = client.runtime.engine.store.engine
            violations += check_all(
                engine,
                world.effects(),
                capture.lines,
                CANARY,
                now=world.clock(),
                lease=client.runtime.sessions.policy,
                baseline=baseline,
                inbox=client.memory.get("inbox"),
            )
            if "webhook_url" in scenario.settings:
                violations += check_webhooks(engine, world.webhooks)
            violations += check_people(engine, now=world.clock())
            made = calls_made(engine)
            if violations:
                records = [r for v in violations for r in v.records]
                trace += ["persisted transitions:", *history(engine, records)]
    except ScenarioFailed as failed:
        violations.append(Violation("the client gets only legitimate answers", str(failed)))
    finally:
        root.removeHandler(capture)
        root.setLevel(previous_level)
        world.close()
    # Where the last crash fired, not the last pass over that point: a point crashed at may
    # be passed again after the restart (the client's retry runs the same path).
    last = faults.fired_at[-1] if faults.fired_at else -1
    return RunResult(
        scenario=scenario.name,
        plan=tuple(plan),
        fired=list(faults.fired),
        after_last_crash=faults.trail[last + 1 :],
        reached=set(faults.trail),
        violations=violations,
        trace=trace,
        calls=made,
    )


#: The tool call's edges only a tool that asks its user (`ToolContext.ask`) takes.
ASKING_EVENTS = ("ask", "take_answers", "answer")


def asking_only(point: CrashPoint) -> bool:
    return point.event in ASKING_EVENTS or point.source == "awaiting_input"


@dataclass
class SweepReport:
    runs: list[RunResult] = field(default_factory=list)
    #: crash point -> scenarios that reached it.
    coverage: dict[CrashPoint, set[str]] = field(default_factory=lambda: defaultdict(set))

    @property
    def violations(self) -> list[RunResult]:
        return [r for r in self.runs if not r.ok]

    def unreached(self, machines: Iterable[str] = DRIVEN_MACHINES) -> list[CrashPoint]:
        return [
            p for m in machines for p in every_crash_point(MACHINES[m]) if p not in self.coverage
        ]

    def unreached_over_http(self) -> list[CrashPoint]:
        """The tool call crash points no scenario over HTTP (the OpenAPI source) reached,
        but for those only a tool that asks its user reaches (an operation never asks)."""
        over_http = {s.name for s in CATALOG if s.over_http}
        return [
            p
            for p in every_crash_point(MACHINES["tool_call"])
            if not asking_only(p) and not self.coverage.get(p, set()) & over_http
        ]

    def crashes_fired(self) -> int:
        return sum(len(r.fired) for r in self.runs)


def sweep(
    scenarios: Sequence[Scenario] = CATALOG,
    *,
    database_url_factory: Callable[[], str | None] | None = None,
    only: Sequence[CrashPoint] | None = None,
    progress: Callable[[RunResult], None] = lambda r: None,
    jobs: int = 1,
) -> SweepReport:
    """Every scenario at every crash point it reaches (or only the plan in `only`).

    Scenarios are independent (each run has its own database and tools' data), so with
    `jobs` > 1 they are swept in that many forked processes; the report is the same. A
    `database_url_factory` (runs on PostgreSQL) keeps the sweep in this process."""
    report = SweepReport()
    if jobs > 1 and database_url_factory is None and len(scenarios) > 1:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            names = [s.name for s in scenarios]
            plan = tuple(only) if only is not None else None
            for runs in pool.map(_sweep_by_name, names, [plan] * len(names)):
                for result in runs:
                    _record(report, result)
                    progress(result)
        return report
    for scenario in scenarios:
        for result in _sweep_scenario(scenario, only, database_url_factory or (lambda: None)):
            _record(report, result)
            progress(result)
    return report


def _record(report: SweepReport, result: RunResult) -> None:
    report.runs.append(result)
    for point in result.reached:
        report.coverage[point].add(result.scenario)


def _sweep_by_name(name: str, only: tuple[CrashPoint, ...] | None) -> list[RunResult]:
    from lockgate.simulation.scenarios import by_name

    return list(_sweep_scenario(by_name(name), only, lambda: None))


def _sweep_scenario(
    scenario: Scenario,
    only: Sequence[CrashPoint] | None,
    database_url_factory: Callable[[], str | None],
) -> Iterator[RunResult]:
    baseline: CallLists | None = None
    if only is not None:
        baseline = _run(scenario, (), database_url_factory()).calls
    queue: list[tuple[CrashPoint, ...]] = [tuple(only)] if only is not None else [()]
    planned = set(queue)
    fault_free: set[CrashPoint] = set()
    while queue:
        plan = queue.pop(0)
        result = _run(scenario, plan, database_url_factory(), baseline)
        if not plan:
            baseline, fault_free = result.calls, result.reached
        yield result
        if only is not None or len(plan) >= MAX_DEPTH:
            continue
        # Deeper plans: crash again at each point first reached after the last crash (of
        # the lifecycles the scenario is about, when it names them).
        base = tuple(result.fired) if plan else ()
        for point in dict.fromkeys(result.after_last_crash):
            if scenario.crash_only is not None and point.machine not in scenario.crash_only:
                continue
            candidate = (*base, point)
            fresh = not plan or point not in fault_free
            if len(candidate) <= MAX_DEPTH and candidate not in planned and fresh:
                planned.add(candidate)
                queue.append(candidate)


def _run(
    scenario: Scenario,
    plan: tuple[CrashPoint, ...],
    database_url: str | None,
    baseline: CallLists | None = None,
) -> RunResult:
    workdir = Path(tempfile.mkdtemp(prefix="lockgate-sim-", dir=scratch_dir()))
    try:
        return run_plan(scenario, plan, workdir, database_url, baseline)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
