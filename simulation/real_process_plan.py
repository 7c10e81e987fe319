"""Which real-process runs to make: each scenario once without faults, then crashed at the
points that run reached (all of them, or a seeded sample)."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lockgate.simulation.invariants import CallLists
from lockgate.simulation.real_process import run_in_process
from lockgate.simulation.scenarios import Scenario
from lockgate.simulation.sweep import RunResult
from lockgate.spec import CrashPoint


@dataclass
class Planned:
    runs: list[RunResult]
    scenarios: int
    #: How long the runs took, start to end.
    seconds: float = 0.0


#: Points a real process reaches only when a wall-clock interval happens to fall inside a
#: short window. A heartbeat while the instance drains: the drain lasts about one heartbeat
#: interval. A dead incarnation's session released from `active`: only if a request of it
#: was still in flight at the moment of death. A session closed from `active`: only if the
#: official client's DELETE reaches the server before the server has seen that client's own
#: GET stream end (the client ends both at once as it leaves the session). A fault-free run
#: may reach one and its crashed twin not (all three were seen), so armed there a run would
#: fail for the clock's sake; the in-process sweep, on a fake clock, crashes them.
TIMED = frozenset(
    CrashPoint.parse(name)
    for moment in ("before_commit", "after_commit")
    for name in (
        f"instance:heartbeat:draining->draining:{moment}",
        f"session:release:active->idle:{moment}",
        f"session:close:active->closed:{moment}",
    )
)

#: Points timed in one scenario only. `drain_while_running`: SIGTERM at once hands the running
#: execution back and gives up the open `execute` request; whichever comes first decides
#: whether that request is answered (the execution's view) or reported lost (-32010). Both
#: are correct; the in-process sweep crashes the lost request's points in the scenarios that
#: lose one on purpose (`stream_lost`, `session_lease`). Armed here, a run fails on the race.
TIMED_IN_SCENARIO = {
    "drain_while_running": frozenset(
        CrashPoint.parse(name)
        for name in (
            "owed_request:lose:owed->lost:before_commit",
            "owed_request:lose:owed->lost:after_commit",
            "owed_request:report:lost->reported:after_effect",
            "owed_request:report:lost->reported:before_commit",
            "owed_request:report:lost->reported:after_commit",
        )
    )
}


def plan_runs(
    scenarios: Sequence[Scenario],
    size: int | None,
    seed: int,
    database_url: Callable[[], str] | None = None,
) -> Planned:
    """Real-process runs: each scenario once without faults (what it reaches, and the calls
    it makes: the baseline of its crashed runs), then crashed at the points that run really
    reached, every one of them (`size` None) or `size` drawn with `seed`. Scenarios that
    no client interface can drive are left out (`simulation.remote.NO_CLIENT_DOOR`), and so
    are those with several instances unless `database_url` gives each run a database of a
    server (PostgreSQL): on SQLite they run in process only."""
    from lockgate.simulation.remote import IN_PROCESS_ONLY, NO_CLIENT_DOOR, SEVERAL_INSTANCES

    rng = random.Random(seed)
    pool = [
        s
        for s in scenarios
        if s.name not in NO_CLIENT_DOOR
        and s.name not in IN_PROCESS_ONLY
        and (database_url is not None or s.name not in SEVERAL_INSTANCES)
    ]

    def url() -> str | None:
        return database_url() if database_url is not None else None

    if size is not None:
        chosen = set(rng.sample(range(len(pool)), min(size, len(pool))))
        pool = [s for i, s in enumerate(pool) if i in chosen]
    runs: list[RunResult] = []
    plans: list[tuple[Scenario, CrashPoint, CallLists]] = []
    for scenario in pool:
        free = run_in_process(scenario, None, url())
        runs.append(free)
        timed = TIMED | TIMED_IN_SCENARIO.get(scenario.name, frozenset())
        points = sorted(free.reached - timed, key=lambda p: p.name)
        plans += [(scenario, point, free.calls) for point in points]
    if size is not None:
        by_scenario: dict[str, list[tuple[Scenario, CrashPoint, CallLists]]] = {}
        for plan in plans:
            by_scenario.setdefault(plan[0].name, []).append(plan)
        plans = [rng.choice(options) for options in by_scenario.values()]
    for scenario, point, baseline in plans:
        runs.append(run_in_process(scenario, point, url(), baseline=baseline))
    return Planned(runs, len(pool))


def plan_runs_apart(
    names: Sequence[str], size: int | None, seed: int, postgres: str | None
) -> Planned:
    """`plan_runs` for the scenarios named, each run on a fresh database of the PostgreSQL
    server at `postgres` (an admin URL) when one is given: made to run in a process of its
    own beside the in-process sweep (`lockgate simulate --real-process`). Its runs spend
    most of their time waiting for real time to pass (a lease to lapse, a server to boot,
    a drain), so beside the sweep they cost the run little more than the sweep itself."""
    from lockgate.simulation.scenarios import by_name

    started = time.monotonic()
    with contextlib.ExitStack() as databases:
        fresh = None
        if postgres is not None:
            from lockgate.machine.db.provision import fresh_databases

            fresh = databases.enter_context(fresh_databases(postgres))
        planned = plan_runs([by_name(name) for name in names], size, seed, database_url=fresh)
    planned.seconds = time.monotonic() - started
    return planned


__all__ = ["TIMED", "TIMED_IN_SCENARIO", "Planned", "plan_runs", "plan_runs_apart"]
