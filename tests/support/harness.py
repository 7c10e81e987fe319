"""A Lockgate deployment that generated tests drive one client or operator action at a time.

`Harness` holds a simulated `World` (a SQLite file in a work directory, the notes tools' data,
a `SimClock`), the instances that are up, the executions the client started, and a reference
model of every record's lifecycle. `DRIVERS` maps each (machine, event) of the driven
lifecycles to the action that makes that event happen on the real engine, the way a client
or an operator would: run code, decide, cancel, let time pass, heartbeat, shut down, crash.
`tests/test_generated_lifecycle.py` turns the spec into a Hypothesis state machine with one
rule per event, so an event added to the spec is a rule the next run, and `missing_drivers()`
names the events nobody drives yet.

The reference model is the spec itself. After every action the new rows of the transition
log are replayed through it: each must be a declared edge leaving the state its record was
last in (or its lifecycle's initial state), and the replayed state of every record must equal
its stored status. On top of that every execution's program says what a run of it may answer
given the decisions recorded for it, so a replay after a crash must give the same answer.

Randomness comes through `pick`: a Hypothesis `DataObject` (draws shrink), a seeded
`random.Random` (smoke runs), or None (always the first option: a deterministic walk).
Needs the `dev` extra (Hypothesis).
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.strategies import DataObject
from sqlalchemy import Engine
from sqlalchemy import select as select_columns
from sqlmodel import Session, col, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Execution, ToolCall, TransitionLog, metadata
from lockgate.machine.db.schema import Session as SessionRow
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionExpired
from lockgate.machine.faults import InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.machine.sessions import request_key
from lockgate.simulation.canary import LEAKING_CODE
from lockgate.simulation.inbox import Inbox, collect
from lockgate.simulation.invariants import Violation, check_all, history
from lockgate.simulation.scenarios import SPIN_CODE, SPIN_ITERATIONS, drain_mid_run
from lockgate.simulation.world import CANARY, LogCapture, World
from lockgate.spec import MACHINES, CrashPoint, MachineSpec, every_crash_point
from lockgate.spec import ExecutionStatus as E

T = TypeVar("T")

#: Where a driver's choices come from (see the module docstring).
Choices = DataObject | random.Random | None
Driver = Callable[["Harness", Choices], None]

PRINCIPAL = "alice"
#: The instance names; a second one joins when a driver needs another instance.
NAMES = ("sim-a", "sim-b")
#: Short enough that the clock rule crosses it; long enough that a run rarely expires by
#: accident.
APPROVAL_TTL = timedelta(minutes=10)
#: Boots in a row that may crash (each armed point fires once, so this is never reached
#: unless the harness itself is broken).
MAX_BOOTS = 8
#: The lifecycles the drivers cover: sessions and owed requests are driven as the HTTP
#: session gate drives them (the same `Sessions` methods, with a client's inbox).
DRIVEN_MACHINES = ("execution", "tool_call", "instance", "session", "owed_request")
#: The table holding each lifecycle's rows (for comparing stored statuses with the model).
TABLE_OF = {
    "execution": "executions",
    "tool_call": "tool_calls",
    "instance": "instances",
    "session": "sessions",
    "owed_request": "owed_requests",
}


def pick(data: Choices, options: Sequence[T], label: str) -> T:
    """One of `options`: drawn by Hypothesis, chosen at random, or the first."""
    if not options:
        raise ValueError(f"nothing to choose for {label}")
    if data is None:
        return options[0]
    if isinstance(data, random.Random):
        return data.choice(list(options))
    return data.draw(st.sampled_from(options), label=label)


def pick_int(data: Choices, low: int, high: int, label: str) -> int:
    if data is None:
        return low
    if isinstance(data, random.Random):
        return data.randint(low, high)
    return data.draw(st.integers(low, high), label=label)


# -- what the client runs ----------------------------------------------------------------------

ANY = object()


@dataclass(frozen=True)
class Outcome:
    status: E
    #: The result the code returns (`ANY`: not checked).
    result: object = ANY
    #: The failure's code (`ANY`: not checked).
    error_code: object = ANY


#: The code raised (an uncaught exception), as opposed to the server failing it.
RAISED = Outcome(E.FAILED, error_code="runtime_error")


@dataclass(frozen=True)
class Program:
    """Agent code and what it answers, keyed by the decisions recorded for its paused calls
    ("accept" or "decline", in call order). A run cut off by a crash may also end interrupted;
    a paused one may also end expired or cancelled."""

    name: str
    code: str
    outcomes: Mapping[tuple[str, ...], Outcome]

    def __repr__(self) -> str:
        return f"Program({self.name})"


def _ends(status: E, result: object = ANY) -> Mapping[tuple[str, ...], Outcome]:
    return {(): Outcome(status, result)}


LIST_ONCE = Program("list_once", "a = tools.notes.list()\nlen(a) >= 0", _ends(E.COMPLETED, True))
LIST_TWICE = Program(
    "list_twice",
    "a = tools.notes.list()\nb = tools.notes.list()\na == b",
    _ends(E.COMPLETED, True),
)
NO_CALLS = Program("no_calls", "x = 20\nx + 22", _ends(E.COMPLETED, 42))
#: Tools that leak their secret into a result, an error and an exception (simulation.canary):
#: the canary invariant holds only because the engine scrubs them.
LEAKY = Program("leaky", LEAKING_CODE, _ends(E.COMPLETED))
RAISES = Program("raises", "raise ValueError('broken')", {(): RAISED})
LIST_THEN_RAISE = Program(
    "list_then_raise", "tools.notes.list()\nraise ValueError('broken')", {(): RAISED}
)
READ_MISSING_CAUGHT = Program(
    "read_missing_caught",
    "try:\n    tools.notes.read(key='missing')\n    r = 'found'\n"
    "except RuntimeError:\n    r = 'caught'\nr",
    _ends(E.COMPLETED, "caught"),
)
READ_MISSING = Program("read_missing", "tools.notes.read(key='missing')", {(): RAISED})
DELETE_BLOCKED = Program(
    "delete_blocked",
    "try:\n    tools.notes.delete(key='k')\n    r = 'deleted'\n"
    "except PermissionError:\n    r = 'blocked'\nr",
    _ends(E.COMPLETED, "blocked"),
)
WRITE_THEN_READ = Program(
    "write_then_read",
    "tools.notes.write(key='k', text='v')\ntools.notes.read(key='k')",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept",): Outcome(E.COMPLETED, {"key": "k", "text": "v"}),
        ("decline",): RAISED,
    },
)
WRITE_CAUGHT = Program(
    "write_caught",
    "try:\n    tools.notes.write(key='w', text='x')\n    r = 'written'\n"
    "except PermissionError:\n    r = 'refused'\nr",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept",): Outcome(E.COMPLETED, "written"),
        ("decline",): Outcome(E.COMPLETED, "refused"),
    },
)
TWO_WRITES = Program(
    "two_writes",
    "tools.notes.write(key='a', text='1')\ntools.notes.write(key='b', text='2')\n'both'",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept",): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept", "accept"): Outcome(E.COMPLETED, "both"),
        ("accept", "decline"): RAISED,
        ("decline",): RAISED,
    },
)

CALLING_PROGRAMS = (LIST_ONCE, LIST_TWICE)
AUTO_PROGRAMS = (*CALLING_PROGRAMS, NO_CALLS, LEAKY)
FAILING_PROGRAMS = (RAISES, LIST_THEN_RAISE, READ_MISSING)
TOOL_FAILURE_PROGRAMS = (READ_MISSING_CAUGHT, READ_MISSING)
PAUSING_PROGRAMS = (WRITE_THEN_READ, WRITE_CAUGHT, TWO_WRITES)
#: Half a second of pure code after a call: what a drain catches running.
SPIN = Program("spin", SPIN_CODE, _ends(E.COMPLETED, SPIN_ITERATIONS))
PROGRAMS = (*AUTO_PROGRAMS, *FAILING_PROGRAMS, READ_MISSING_CAUGHT, DELETE_BLOCKED,
            *PAUSING_PROGRAMS, SPIN)  # fmt: skip

PROGRAM_BY_CODE = {p.code: p for p in PROGRAMS}

#: Statuses any execution may end in besides its program's own answer.
_ALSO_LEGITIMATE = frozenset({E.EXPIRED, E.CANCELLED, E.INTERRUPTED})


@dataclass
class CrashPlan:
    """What happens around the crash an action is armed for."""

    #: A second point armed once the first fired: it fires during the recovery, if reached.
    then: CrashPoint | None = None
    #: The incarnation that boots after the crash recovers conservatively.
    conservative: bool = False


def _error_code(outcome: Mapping[str, object]) -> object:
    error = outcome.get("error")
    return error.get("code") if isinstance(error, dict) else None


def _maintain(runtime: Runtime) -> None:
    runtime.maintain()


# -- the harness -------------------------------------------------------------------------------


class Harness:
    def __init__(
        self,
        workdir: Path,
        *,
        machines: Mapping[str, MachineSpec] = MACHINES,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        self.machines = machines
        self.world = World(
            workdir,
            settings={
                "policy": "notes.delete=block",
                "approval_ttl": APPROVAL_TTL,
                **(settings or {}),
            },
        )
        self.default_settings = dict(self.world.settings)
        self.clock = self.world.clock
        self.faults = self.world.faults
        #: Instance name -> its current incarnation, for every instance that is up.
        self.live: dict[str, Runtime] = {}
        #: Execution id -> what the client knows of it, in the order it learned them.
        self.executions: dict[str, Program] = {}
        #: (machine, record id) -> the state the spec replay says it is in.
        self.model: dict[tuple[str, str], str] = {}
        self.replay_errors: list[str] = []
        #: (machine, event) -> how many times the log showed it (coverage).
        self.observed: Counter[tuple[str, str]] = Counter()
        #: Client answers no client should ever get.
        self.problems: list[str] = []
        #: What the harness did, for failure reports.
        self.trace: list[str] = []
        self.crashes = 0
        #: The known executions paused when the harness last settled.
        self.waiting: list[str] = []
        #: The client's sessions (opened by its `initialize`), and what it received on them.
        self.sessions: list[str] = []
        self.inbox = Inbox()
        self._requests = 0
        self._plan: CrashPlan | None = None
        self._log_seen = 0
        self._edges = {
            name: {(t.event, s, d) for t in spec.transitions for s, d in t.edges()}
            for name, spec in machines.items()
        }
        self.capture = LogCapture()
        root = logging.getLogger()
        self._root_level = root.level
        root.addHandler(self.capture)
        root.setLevel(logging.DEBUG)
        self.db: Engine | None = None
        try:
            self._boot(NAMES[0])
            self.db = open_engine(self.world.database_url)
            self.settle()
        except BaseException:
            self.close()
            raise

    # -- lifecycle of the harness ------------------------------------------------------------

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.capture)
        root.setLevel(self._root_level)
        self.world.close()
        self.live.clear()
        if self.db is not None:
            self.db.dispose()
            self.db = None

    @property
    def engine(self) -> Engine:
        if self.db is None:
            raise RuntimeError("the harness is closed")
        return self.db

    @property
    def runtime(self) -> Runtime:
        """The first instance that is up."""
        return self.live[min(self.live)]

    def pick_runtime(self, data: Choices) -> Runtime:
        """The instance a request lands on (any instance may serve any request)."""
        return self.live[pick(data, sorted(self.live), "instance")]

    def note(self, line: str) -> None:
        self.trace.append(line)

    # -- booting, crashing, settling ---------------------------------------------------------

    def _boot(self, name: str) -> Runtime:
        """A new incarnation of `name`, recovering on boot; a crash during the boot (an armed
        point reached by the recovery) is one more death, and the boot starts over."""
        for _ in range(MAX_BOOTS):
            conservative = self._plan.conservative if self._plan is not None else False
            self.world.settings = {**self.default_settings, "conservative_recovery": conservative}
            try:
                runtime = self.world.boot(name=name)
            except InjectedCrash as crash:
                self.note(f"CRASH during the boot of {name} at {crash.point.name}")
                self._crashed()
                continue
            finally:
                self.world.settings = dict(self.default_settings)
            self.live[name] = runtime
            self.note(f"booted {name} (incarnation {runtime.lease.incarnation})")
            return runtime
        raise RuntimeError(f"{name} crashed {MAX_BOOTS} times in a row while booting")

    def _crashed(self) -> None:
        """A crash fired: disarm everything (arming the plan's second point), and drop every
        runtime that is not up (one that crashed while booting)."""
        self.crashes += 1
        self.faults.armed.clear()
        self.faults.skip = 0
        if self._plan is not None and self._plan.then is not None:
            self.faults.armed.add(self._plan.then)
            self._plan.then = None
        up = set(map(id, self.live.values()))
        for runtime in list(self.world.runtimes):
            if id(runtime) not in up:
                self.world.abandon(runtime)

    def _drop(self, runtime: Runtime) -> str:
        name = runtime.settings.instance_name
        if self.live.get(name) is runtime:
            del self.live[name]
        self.world.abandon(runtime)
        return name

    def _act(self, runtime: Runtime, action: Callable[[], None]) -> bool:
        """Run one action on `runtime`; if an armed point fires, the process died: boot a new
        incarnation of the same instance (it recovers on boot). False after a crash."""
        try:
            action()
        except InjectedCrash as crash:
            name = runtime.settings.instance_name
            self.note(f"CRASH of {name} at {crash.point.name}")
            self._drop(runtime)
            self._crashed()
            self._boot(name)
            return False
        return True

    @contextmanager
    def armed(
        self,
        points: Sequence[CrashPoint],
        *,
        skip: int = 0,
        then: CrashPoint | None = None,
        conservative: bool = False,
    ) -> Iterator[None]:
        """Arm `points` for the actions inside (the first one reached `skip` + 1 times fires);
        disarm whatever did not fire afterwards."""
        self.faults.armed.clear()
        self.faults.armed.update(points)
        self.faults.skip = skip
        self._plan = CrashPlan(then=then, conservative=conservative)
        what = ", ".join(p.name for p in points) if len(points) < 4 else f"{len(points)} points"
        self.note(f"armed {what} (skip {skip}, then {then}, conservative {conservative})")
        try:
            yield
        finally:
            self._plan = None
            self.faults.armed.clear()
            self.faults.skip = 0

    def settle(self) -> None:
        """What the instances' background loops do between requests: an instance that learned
        it was declared dead is restarted by its supervisor, and pending work is run. Then
        the new transitions are replayed through the spec."""
        for name, runtime in list(self.live.items()):
            if runtime.fenced.is_set():
                self.note(f"{name} was fenced; its supervisor restarts it")
                self._drop(runtime)
                self._boot(name)
        if not self.live:
            self._boot(NAMES[0])
        for runtime in self.live.values():
            runtime.engine.run_pending()
        self._discover()
        self._replay()
        self.waiting = self.paused()

    # -- client and operator actions ---------------------------------------------------------

    def execute(self, data: Choices, program: Program) -> None:
        """Run `program`: through `execute` (stored and claimed in one transaction, run until
        it ends or pauses), or queued with `submit` and claimed by `run`."""
        runtime = self.pick_runtime(data)
        how = pick(data, ["execute", "submit"], "how the code is started")
        name = runtime.settings.instance_name

        def run() -> None:
            self.note(f"{name}: {how} {program.name}")
            if how == "execute":
                execution_id = runtime.engine.execute(PRINCIPAL, program.code).id
                self.executions.setdefault(execution_id, program)
            else:
                execution_id = runtime.engine.submit(PRINCIPAL, program.code)
                self.executions[execution_id] = program
                runtime.engine.run(execution_id)
            self.note(f"{name}: {program.name} is {execution_id}")

        self._act(runtime, run)

    def decide(self, data: Choices, action: Action) -> None:
        """A person's decision on a paused execution (nothing when none is paused)."""
        paused = self.paused()
        if not paused:
            return
        execution_id = pick(data, paused, "paused execution")
        runtime = self.pick_runtime(data)

        def resume() -> None:
            self.note(f"{runtime.settings.instance_name}: resume {execution_id} {action}")
            try:
                runtime.engine.resume(execution_id, PRINCIPAL, action)
            except ExecutionExpired:
                if not self._overdue(execution_id):
                    self.problems.append(
                        f"resume of {execution_id} said expired before its deadline"
                    )

        self._act(runtime, resume)

    def cancel(self, data: Choices, *, queued: bool) -> None:
        """Cancel a queued execution (submitted, not yet run), or a paused one."""
        runtime = self.pick_runtime(data)
        if queued:

            def cancel_queued() -> None:
                execution_id = runtime.engine.submit(PRINCIPAL, LIST_ONCE.code)
                self.executions[execution_id] = LIST_ONCE
                self.note(f"{runtime.settings.instance_name}: submit+cancel {execution_id}")
                view = runtime.engine.cancel(execution_id, PRINCIPAL)
                if view.status != E.CANCELLED:
                    self.problems.append(f"cancel of queued {execution_id} left it {view.status}")

            self._act(runtime, cancel_queued)
            return
        paused = self.paused()
        if not paused:
            return
        execution_id = pick(data, paused, "paused execution")

        def cancel_paused() -> None:
            self.note(f"{runtime.settings.instance_name}: cancel {execution_id}")
            overdue = self._overdue(execution_id)
            try:
                status = runtime.engine.cancel(execution_id, PRINCIPAL).status
            except ExecutionExpired:
                status = E.EXPIRED
            if status != E.CANCELLED and not (overdue and status == E.EXPIRED):
                self.problems.append(f"cancel of paused {execution_id} left it {status}")

        self._act(runtime, cancel_paused)

    def expire(self, data: Choices) -> None:
        """Let the approval deadline pass, then find it: by the sweep, a maintenance round,
        a client reading the execution, or a late decision."""
        paused = self.paused()
        if not paused:
            return
        self.advance(APPROVAL_TTL + timedelta(seconds=1))
        how = pick(data, ["sweep", "maintain", "read", "resume"], "how the expiry is found")
        runtime = self.pick_runtime(data)
        execution_id = pick(data, paused, "paused execution")

        def find() -> None:
            self.note(f"{runtime.settings.instance_name}: expiry found by {how}")
            if how == "sweep":
                runtime.engine.expire_due()
            elif how == "maintain":
                runtime.maintain()
            elif how == "read":
                view = runtime.engine.get(execution_id, PRINCIPAL)
                if view.status != E.EXPIRED:
                    self.problems.append(f"{execution_id} is {view.status} past its deadline")
            else:
                try:
                    runtime.engine.resume(execution_id, PRINCIPAL, Action.ACCEPT)
                except ExecutionExpired:
                    return
                self.problems.append(f"{execution_id} was resumed past its deadline")

        self._act(runtime, find)

    def heartbeat(self, data: Choices) -> None:
        """One maintenance round (heartbeat, recovery, expiry sweep) of an instance."""
        runtime = self.pick_runtime(data)
        self.note(f"{runtime.settings.instance_name}: maintain")
        self._act(runtime, lambda: _maintain(runtime))

    def graceful_restart(self, data: Choices, *, allow_stop: bool = True) -> None:
        """SIGTERM: drain (the lease still renewed), stop, and (unless another instance stays
        up and the operator scales down) boot a new incarnation."""
        runtime = self.pick_runtime(data)
        name = runtime.settings.instance_name
        scale_down = allow_stop and len(self.live) > 1 and pick(data, [False, True], "scale down")

        def restart() -> None:
            self.note(f"{name}: graceful {'stop' if scale_down else 'restart'}")
            runtime.maintain()
            runtime.drain()
            runtime.maintain()
            runtime.close()
            self._drop(runtime)
            if not scale_down:
                self._boot(name)

        self._act(runtime, restart)

    def drain_while_running(self, data: Choices) -> None:
        """SIGTERM while code runs: the drain stops the code and hands its execution back
        (pending, released); the instance restarts, and whichever instance claims the
        execution next runs it again from its checkpoint."""
        runtime = self.pick_runtime(data)
        name = runtime.settings.instance_name

        def drain() -> None:
            self.note(f"{name}: {SPIN.name}, then SIGTERM while it runs")
            ex = runtime.engine.begin(PRINCIPAL, SPIN.code)
            self.executions.setdefault(ex.id, SPIN)
            self.note(f"{name}: {SPIN.name} is {ex.id}")
            drain_mid_run(runtime, ex)
            runtime.maintain()
            runtime.close()
            self._drop(runtime)
            self._boot(name)

        self._act(runtime, drain)

    def lose_instance(self, data: Choices) -> None:
        """An instance stops for good and is declared dead: by its own next incarnation, by
        another instance once its lease lapsed, or (still running, unaware) by another."""
        victim = self.pick_runtime(data)
        name = victim.settings.instance_name
        other = next(n for n in NAMES if n != name)
        how = pick(data, ["restart", "takeover", "zombie"], "how it is declared dead")
        self.note(f"{name}: lost ({how})")
        if how == "restart":
            self._drop(victim)
            self._boot(name)
            return
        if how == "takeover":
            self._drop(victim)
        self.advance(victim.settings.lease_ttl + timedelta(seconds=1))
        survivor = self.live.get(other)
        if survivor is not None:
            survivor.maintain()
        if survivor is None or survivor.fenced.is_set():
            # Nobody else is up, or the other instance stalled too and was declared dead
            # meanwhile: a new incarnation of it boots, recovering.
            if survivor is not None:
                self._drop(survivor)
            self._boot(other)
        if how == "zombie" and self.live.get(name) is victim:
            victim.maintain()  # its next heartbeat finds it was declared dead
            if not victim.fenced.is_set():
                self.problems.append(f"{name} kept working after it was declared dead")

    def advance(self, delta: timedelta) -> None:
        self.clock.advance(delta)
        self.note(f"clock +{delta}")

    def crash_during(
        self,
        data: Choices,
        points: Sequence[CrashPoint],
        action: Callable[[], None],
        *,
        conservative: bool = False,
        max_skip: int = 0,
    ) -> None:
        """Arm one of `points` (drawn), run `action`; the crash restarts the instance."""
        point = pick(data, points, "crash point")
        # A point on the path of every call (not start, complete or resume) is passed once
        # per call: crash at a later call, too.
        per_call = point.machine == "tool_call" or point.event == "checkpoint"
        skip = pick_int(data, 0, max_skip, "calls before the crash") if per_call else 0
        with self.armed([point], skip=skip, conservative=conservative):
            action()

    # -- reading what is stored --------------------------------------------------------------

    def statuses(self) -> dict[str, str]:
        with Session(self.engine) as s:
            rows = s.exec(select(Execution.id, Execution.status)).all()
        return {row[0]: row[1] for row in rows}

    def paused(self) -> list[str]:
        """The known executions waiting for a decision, in the order the client learned them."""
        stored = self.statuses()
        return [i for i in self.executions if stored.get(i) == E.WAITING_FOR_INTERACTION]

    def _discover(self) -> None:
        """Executions stored by an action cut off before the client got the id (it finds
        them in its principal's list); the program is known by its code."""
        with Session(self.engine) as s:
            rows = s.exec(select(Execution.id, Execution.code, Execution.created_at)).all()
        for execution_id, code, _ in sorted(rows, key=lambda r: (r[2], r[1])):
            program = PROGRAM_BY_CODE.get(code)
            if execution_id not in self.executions and program is not None:
                self.note(f"found {program.name} {execution_id}")
                self.executions[execution_id] = program

    def _overdue(self, execution_id: str) -> bool:
        with Session(self.engine) as s:
            row = s.get(Execution, execution_id)
        return row is not None and row.deadline is not None and self.clock() >= row.deadline

    def _replay(self) -> None:
        """Replay the transitions logged since the last call through the spec."""
        with Session(self.engine) as s:
            rows = list(
                s.exec(
                    select(TransitionLog)
                    .where(col(TransitionLog.id) > self._log_seen)
                    .order_by(col(TransitionLog.id))
                )
            )
        for row in rows:
            assert row.id is not None
            self._log_seen = row.id
            key = (row.machine, row.record_id)
            self.observed[(row.machine, row.event)] += 1
            spec = self.machines.get(row.machine)
            if spec is None:
                self.replay_errors.append(f"log row {row.id}: no lifecycle {row.machine!r}")
                continue
            edge = f"{row.machine} {row.record_id}: {row.event} {row.source}->{row.dest}"
            if (row.event, row.source, row.dest) not in self._edges[row.machine]:
                self.replay_errors.append(f"log row {row.id}: {edge} is not an edge of the spec")
            before = self.model.get(key, spec.initial.name)
            if row.source != before:
                self.replay_errors.append(
                    f"log row {row.id}: {edge} left {row.source!r} but the model has it "
                    f"in {before!r}"
                )
            self.model[key] = row.dest

    def model_disagreements(self) -> list[str]:
        """Where the reference model and the database disagree (with every replay error)."""
        out = list(self.replay_errors)
        stored: set[tuple[str, str]] = set()
        with self.engine.connect() as conn:
            for machine, table_name in TABLE_OF.items():
                spec = self.machines.get(machine)
                if spec is None:
                    continue
                table = metadata.tables[table_name]
                for record_id, status in conn.execute(select_columns(table.c.id, table.c.status)):
                    key = (machine, str(record_id))
                    stored.add(key)
                    expected = self.model.get(key, spec.initial.name)
                    if status != expected:
                        out.append(
                            f"{machine} {record_id} is stored {status!r}; the spec replay says "
                            f"{expected!r}"
                        )
        out += [
            f"{m} {r} is in the log but not stored" for m, r in self.model if (m, r) not in stored
        ]
        return out

    def decisions(self) -> dict[str, tuple[str, ...]]:
        """Per execution, the decisions recorded on its calls in call order."""
        with Session(self.engine) as s:
            calls = list(s.exec(select(ToolCall).order_by(col(ToolCall.seq))))
        out: dict[str, list[str]] = {}
        for call in calls:
            decision = call.decision
            if isinstance(decision, dict):
                action = decision.get("action")
                out.setdefault(call.execution_id, []).append(
                    "accept" if action == Action.ACCEPT else "decline"
                )
        return {k: tuple(v) for k, v in out.items()}

    def wrong_answers(self) -> list[str]:
        """Client-level problems, and every known execution whose stored answer is not what
        its program gives for the decisions recorded."""
        out = list(self.problems)
        decided = self.decisions()
        with Session(self.engine) as s:
            rows = {r.id: r for r in s.exec(select(Execution))}
        for execution_id, program in self.executions.items():
            row = rows.get(execution_id)
            if row is None:
                out.append(f"{execution_id} ({program.name}) was never stored")
                continue
            status = E(row.status)
            if status in (E.PENDING, E.RUNNING) or status in _ALSO_LEGITIMATE:
                continue
            made = decided.get(execution_id, ())
            expected = program.outcomes.get(made)
            outcome = row.outcome if isinstance(row.outcome, dict) else {}
            said = f"{execution_id} ({program.name}, decisions {made})"
            if expected is None:
                out.append(f"{said} is {status}; the program has no answer for those decisions")
            elif status != expected.status:
                out.append(
                    f"{said} is {status}, expected {expected.status}: {outcome.get('error')}"
                )
            elif expected.result is not ANY and outcome.get("result") != expected.result:
                out.append(f"{said} returned {outcome.get('result')!r}, not {expected.result!r}")
            elif expected.error_code is not ANY and _error_code(outcome) != expected.error_code:
                out.append(f"{said} failed with {outcome.get('error')!r}")
        return out

    def violations(self) -> list[Violation]:
        """`simulation.invariants.check_all` on what is persisted (quiescent: nothing runs;
        a lost report may wait for its live session's next GET, a durable wait)."""
        return check_all(
            self.engine,
            self.world.notes.effects(),
            self.capture.lines,
            CANARY,
            quiescent=True,
            reports_may_wait=True,
            inbox=self.inbox,
        )

    # -- sessions and the ledger, as the HTTP session gate drives them ------------------------

    def live_sessions(self) -> list[str]:
        with Session(self.engine) as s:
            rows = {r.id: r.status for r in s.exec(select(SessionRow))}
        return [i for i in self.sessions if rows.get(i) in ("active", "idle")]

    def session(self, data: Choices, runtime: Runtime) -> str:
        """A live session of the client's (a new one, by an `initialize`, when none is live
        or the client picks a new one)."""
        live = self.live_sessions()
        if live and pick(data, [False, True], "a session of its own") is False:
            return pick(data, live, "session")

        def open_session() -> None:
            session_id = uuid.uuid4().hex
            self.sessions.append(session_id)
            runtime.sessions.open(session_id, PRINCIPAL, "2025-11-25", {"name": "h"}, {})
            runtime.sessions.end_request(session_id)

        self._act(runtime, open_session)
        live = self.live_sessions()
        return live[-1] if live else ""

    def request_id(self) -> str:
        self._requests += 1
        return f"q{self._requests}"

    def request(self, data: Choices, *, answered: bool) -> None:
        """A tools/call on a session: owed, run, then answered (or its stream closes first
        and the id is lost)."""
        runtime = self.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return
        program = pick(data, CALLING_PROGRAMS, "program")
        request_id = self.request_id()

        def call() -> None:
            sessions = runtime.sessions
            self.inbox.sent(request_id)
            sessions.begin_request(session_id)
            owed = sessions.owe(session_id, request_id, "tools/call", None)
            self.note(f"{runtime.settings.instance_name}: {request_id} on {session_id[:8]}")
            if answered:
                view = runtime.engine.execute(
                    PRINCIPAL, program.code, session_id, request_key(session_id, request_id)
                )
                self.executions.setdefault(view.id, program)
                self.inbox.answer(request_id)  # the response is written: the client has it
                sessions.answered(owed)
            else:
                sessions.lose(owed)  # the client's stream closed before the answer
            sessions.end_request(session_id)

        self._act(runtime, call)

    def collect(self, data: Choices) -> None:
        """The client's collecting GET on one of its sessions."""
        live = self.live_sessions()
        if not live:
            return
        session_id = pick(data, live, "session")
        runtime = self.pick_runtime(data)
        self.note(f"{runtime.settings.instance_name}: GET on {session_id[:8]}")
        self._act(runtime, lambda: collect(self.inbox, runtime.sessions, session_id))

    def close_session(self, data: Choices, *, busy: bool = False) -> None:
        """DELETE on a session (with a request still in flight, when `busy`)."""
        runtime = self.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return

        def close() -> None:
            owed = None
            if busy:
                runtime.sessions.begin_request(session_id)
                owed = runtime.sessions.owe(session_id, self.request_id(), "tools/call", None)
            self.note(f"{runtime.settings.instance_name}: DELETE {session_id[:8]}")
            runtime.sessions.close(session_id)
            if owed is not None:
                runtime.sessions.lose(owed)  # the request's stream ends with its session

        self._act(runtime, close)

    def die_mid_request(self, data: Choices, *, after_close: bool = False) -> None:
        """The process dies with a request in flight (its session active, the id owed); the
        next incarnation's recovery releases the session and loses the id. With
        `after_close`, the client closed the session first: the lost id is abandoned."""
        runtime = self.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return
        name = runtime.settings.instance_name

        def begin() -> None:
            request_id = self.request_id()
            self.inbox.sent(request_id)
            runtime.sessions.begin_request(session_id)
            runtime.sessions.owe(session_id, request_id, "tools/call", None)
            if after_close:
                runtime.sessions.close(session_id)

        if self._act(runtime, begin):
            self.note(f"{name}: dies with a request in flight")
            self._drop(runtime)
            self._boot(name)

    def expire_sessions(self, data: Choices) -> None:
        """Time passes beyond the sessions' idle timeout; a maintenance round sweeps."""
        runtime = self.pick_runtime(data)
        self.advance(runtime.sessions.policy.idle_timeout + timedelta(seconds=1))
        self.heartbeat(data)

    def report(self, problems: Sequence[object], records: Sequence[str] = ()) -> str:
        """A failure message: the problems, what the harness did, and the records' history."""
        lines = [f"  {p}" for p in problems]
        lines += ["what the harness did (latest last):", *(f"  {t}" for t in self.trace[-40:])]
        if records:
            lines += ["persisted transitions:", *(f"  {h}" for h in history(self.engine, records))]
        return "\n".join(lines)


# -- the drivers -------------------------------------------------------------------------------


def _points(machine: str, event: str, *phases: str) -> tuple[CrashPoint, ...]:
    """The spec's crash points of one event (all its edges) in the given phases."""
    found = tuple(
        p
        for p in every_crash_point(MACHINES[machine])
        if p.event == event and (not phases or p.phase in phases)
    )
    if not found:
        raise LookupError(f"the spec has no crash point {machine}:{event} {phases}")
    return found


#: Crash points inside a run of auto-approved idempotent calls (LIST_ONCE, LIST_TWICE): the
#: execution is running and every call is settled, unsent or safe to call again, so
#: recovery requeues it.
REQUEUE_POINTS = (
    *_points("execution", "start", "after_commit"),
    *_points("execution", "checkpoint"),
    *_points("tool_call", "auto_approve"),
    *_points("tool_call", "dispatch"),
    *_points("tool_call", "succeed"),
    *_points("execution", "complete", "before_commit"),
)
#: After the intent was committed and before the result was: the call may have run.
DISPATCHED_POINTS = (
    *_points("tool_call", "dispatch", "after_commit", "after_effect"),
    *_points("tool_call", "succeed", "before_commit"),
)
#: The latest call is still requested or approved (nothing sent).
UNSENT_POINTS = (
    *_points("execution", "checkpoint", "after_commit"),
    *_points("tool_call", "auto_approve"),
    *_points("tool_call", "dispatch", "before_commit"),
)


def _later_calls(program: Program) -> int:
    return 1 if program is LIST_TWICE else 0


def run_auto(h: Harness, data: Choices) -> None:
    """Code that runs to its end without asking anyone: start, complete."""
    h.execute(data, pick(data, AUTO_PROGRAMS, "program"))


def run_calls(h: Harness, data: Choices) -> None:
    """Code whose calls the policy approves: checkpoint, auto_approve, dispatch, succeed."""
    h.execute(data, pick(data, CALLING_PROGRAMS, "program"))


def run_failing(h: Harness, data: Choices) -> None:
    h.execute(data, pick(data, FAILING_PROGRAMS, "program"))


def run_tool_failure(h: Harness, data: Choices) -> None:
    h.execute(data, pick(data, TOOL_FAILURE_PROGRAMS, "program"))


def run_blocked(h: Harness, data: Choices) -> None:
    h.execute(data, DELETE_BLOCKED)


def run_pausing(h: Harness, data: Choices) -> None:
    h.execute(data, pick(data, PAUSING_PROGRAMS, "program"))


def accept(h: Harness, data: Choices) -> None:
    h.decide(data, Action.ACCEPT)


def decline(h: Harness, data: Choices) -> None:
    h.decide(data, pick(data, [Action.DECLINE, Action.CANCEL], "decision"))


def expire(h: Harness, data: Choices) -> None:
    h.expire(data)


def cancel(h: Harness, data: Choices) -> None:
    queued = not h.paused() or pick(data, [False, True], "cancel a queued execution")
    h.cancel(data, queued=queued)


def withdraw(h: Harness, data: Choices) -> None:
    h.cancel(data, queued=False)


def heartbeat(h: Harness, data: Choices) -> None:
    h.heartbeat(data)


def graceful_restart(h: Harness, data: Choices) -> None:
    h.graceful_restart(data)


def lose_instance(h: Harness, data: Choices) -> None:
    h.lose_instance(data)


def drain_while_running(h: Harness, data: Choices) -> None:
    h.drain_while_running(data)


def crash_requeue(h: Harness, data: Choices) -> None:
    """Crash while auto-approved calls run; recovery requeues, the next run replays."""
    program = pick(data, [LIST_TWICE, LIST_ONCE], "program")
    h.crash_during(
        data, REQUEUE_POINTS, lambda: h.execute(data, program), max_skip=_later_calls(program)
    )


def crash_redispatch(h: Harness, data: Choices) -> None:
    """Crash with an idempotent call dispatched: it is called again with the same key."""
    program = pick(data, [LIST_ONCE, LIST_TWICE], "program")
    h.crash_during(
        data, DISPATCHED_POINTS, lambda: h.execute(data, program), max_skip=_later_calls(program)
    )


def crash_in_doubt(h: Harness, data: Choices) -> None:
    """Crash with a call dispatched that may not be repeated: an approved write, or any call
    under conservative recovery. It ends in doubt and its execution interrupted."""
    options = ["conservative", "approved write"] if h.paused() else ["conservative"]
    if pick(data, options, "what is in doubt") == "approved write":
        h.crash_during(data, DISPATCHED_POINTS, lambda: h.decide(data, Action.ACCEPT))
    else:
        program = pick(data, [LIST_ONCE, LIST_TWICE], "program")
        h.crash_during(data, DISPATCHED_POINTS, lambda: h.execute(data, program), conservative=True)


def crash_interrupt(h: Harness, data: Choices) -> None:
    """A crash recovery may not go on from: a call in doubt, or conservative recovery."""
    if pick(data, ["in doubt", "conservative"], "why it is interrupted") == "in doubt":
        crash_in_doubt(h, data)
        return
    program = pick(data, [LIST_TWICE, LIST_ONCE], "program")
    h.crash_during(data, REQUEUE_POINTS, lambda: h.execute(data, program), conservative=True)


def crash_withdraw(h: Harness, data: Choices) -> None:
    """Crash before a call was sent, recovered conservatively: the execution is interrupted
    and its unsent call withdrawn."""
    program = pick(data, [LIST_ONCE, LIST_TWICE], "program")
    h.crash_during(
        data,
        UNSENT_POINTS,
        lambda: h.execute(data, program),
        conservative=True,
        max_skip=_later_calls(program),
    )


def session_request(h: Harness, data: Choices) -> None:
    h.request(data, answered=True)


def stream_closed(h: Harness, data: Choices) -> None:
    h.request(data, answered=False)


def report_lost(h: Harness, data: Choices) -> None:
    """A request lost on its stream, then the client's GET that is told so."""
    h.request(data, answered=False)
    h.collect(data)


def close_session(h: Harness, data: Choices) -> None:
    h.close_session(data, busy=pick(data, [False, True], "a request in flight"))


def abandon_reports(h: Harness, data: Choices) -> None:
    """A report nobody collected: its session is closed (or expires) first."""
    h.request(data, answered=False)
    if pick(data, ["close", "expire"], "how the session ends") == "close":
        h.close_session(data)
    else:
        h.expire_sessions(data)


def die_mid_request(h: Harness, data: Choices) -> None:
    h.die_mid_request(data)


def die_after_close(h: Harness, data: Choices) -> None:
    h.die_mid_request(data, after_close=True)


def expire_sessions(h: Harness, data: Choices) -> None:
    h.session(data, h.pick_runtime(data))
    h.expire_sessions(data)


def _driven_points(machines: Mapping[str, MachineSpec]) -> list[CrashPoint]:
    return [p for m in DRIVEN_MACHINES if m in machines for p in every_crash_point(machines[m])]


#: Client and operator actions the generic crash rule runs with a point armed.
_ACTIONS: Mapping[str, Driver] = {
    "auto": run_auto,
    "failing": run_failing,
    "tool failure": run_tool_failure,
    "blocked": run_blocked,
    "pausing": run_pausing,
    "accept": accept,
    "decline": decline,
    "cancel": cancel,
    "expire": expire,
    "heartbeat": heartbeat,
    "graceful restart": graceful_restart,
    "drain while running": drain_while_running,
    "session request": session_request,
    "stream closed": stream_closed,
    "collecting GET": report_lost,
    "DELETE": close_session,
    "sessions expire": expire_sessions,
}


def crash_anywhere(h: Harness, data: Choices) -> None:
    """The generic crash: a client or operator action with one crash point armed (drawn from
    the spec's points of the driven lifecycles), or crashing at the n-th point the action
    passes; optionally a second point armed for the recovery."""
    action = _ACTIONS[pick(data, list(_ACTIONS), "action")]
    points = _driven_points(h.machines)
    then = pick(data, [None, *points], "second crash, during the recovery")
    if pick(data, ["named point", "n-th point"], "where it crashes") == "named point":
        armed, skip = [pick(data, points, "crash point")], 0
    else:
        armed, skip = points, pick_int(data, 0, 15, "points passed before the crash")
    conservative = pick(data, [False, True], "conservative recovery")
    with h.armed(armed, skip=skip, then=then, conservative=conservative):
        action(h, data)


def clean_restart(h: Harness, data: Choices) -> None:
    """A clean restart of one instance (never scaling down)."""
    h.graceful_restart(data, allow_stop=False)


DRIVERS: Mapping[tuple[str, str], Driver] = {
    ("execution", "start"): run_auto,
    ("execution", "checkpoint"): run_calls,
    ("execution", "complete"): run_auto,
    ("execution", "fail"): run_failing,
    ("execution", "pause"): run_pausing,
    ("execution", "resume"): accept,
    ("execution", "expire"): expire,
    ("execution", "cancel"): cancel,
    ("execution", "hand_back"): drain_while_running,
    ("execution", "requeue"): crash_requeue,
    ("execution", "interrupt"): crash_interrupt,
    ("tool_call", "auto_approve"): run_calls,
    ("tool_call", "request_approval"): run_pausing,
    ("tool_call", "block"): run_blocked,
    ("tool_call", "approve"): accept,
    ("tool_call", "decline"): decline,
    ("tool_call", "expire"): expire,
    ("tool_call", "withdraw"): withdraw,
    ("tool_call", "dispatch"): run_calls,
    ("tool_call", "succeed"): run_calls,
    ("tool_call", "fail"): run_tool_failure,
    ("tool_call", "withdraw_on_crash"): crash_withdraw,
    ("tool_call", "redispatch"): crash_redispatch,
    ("tool_call", "mark_in_doubt"): crash_in_doubt,
    ("instance", "heartbeat"): heartbeat,
    ("instance", "drain"): graceful_restart,
    ("instance", "stop"): graceful_restart,
    ("instance", "declare_dead"): lose_instance,
    ("session", "begin_request"): session_request,
    ("session", "end_request"): session_request,
    ("session", "destroy"): expire_sessions,
    ("session", "close"): close_session,
    ("session", "release"): die_mid_request,
    ("owed_request", "answer"): session_request,
    ("owed_request", "lose"): stream_closed,
    ("owed_request", "report"): report_lost,
    ("owed_request", "abandon"): abandon_reports,
    ("owed_request", "abandon_on_crash"): die_after_close,
    ("owed_request", "lose_in_crash"): die_mid_request,
}


def _has_paused(h: Harness) -> bool:
    return bool(h.waiting)


#: When a driver can do something at all (it does nothing otherwise); the generated rules
#: use these as preconditions, so no step is spent on a rule that cannot act.
PRECONDITIONS: Mapping[tuple[str, str], Callable[[Harness], bool]] = {
    ("execution", "resume"): _has_paused,
    ("execution", "expire"): _has_paused,
    ("tool_call", "approve"): _has_paused,
    ("tool_call", "decline"): _has_paused,
    ("tool_call", "expire"): _has_paused,
    ("tool_call", "withdraw"): _has_paused,
}


def driven_events(machines: Mapping[str, MachineSpec] = MACHINES) -> list[tuple[str, str]]:
    """(machine, event) for every event of the driven lifecycles, in spec order."""
    return [(m, e) for m in DRIVEN_MACHINES if m in machines for e in machines[m].events()]


def missing_drivers(machines: Mapping[str, MachineSpec] = MACHINES) -> list[tuple[str, str]]:
    """The spec events of the driven lifecycles that no driver makes happen."""
    return [key for key in driven_events(machines) if key not in DRIVERS]


__all__ = [
    "DRIVERS",
    "PRECONDITIONS",
    "PROGRAMS",
    "Choices",
    "Driver",
    "Harness",
    "Program",
    "clean_restart",
    "crash_anywhere",
    "driven_events",
    "missing_drivers",
    "pick",
]
