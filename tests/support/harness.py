"""A Lockgate deployment that generated tests drive one client or operator action at a time.

`Harness` puts together what the other modules of `tests/support/` hold: a simulated
deployment (`deployment`: a `World`, the instances that are up, the crashes armed), what the
client knows (`client`: the executions it started, its sessions and inbox), the actions per
driven lifecycle (`execution_drivers`, `instance_drivers`, `session_drivers`) and a reference
model of every record's lifecycle (`spec_replay`). `DRIVERS` below maps each (machine, event)
of the driven lifecycles to the action that makes that event happen on the real engine, the
way a client or an operator would: run code, decide, cancel, let time pass, heartbeat, shut
down, crash. `tests/unit/test_generated_lifecycle.py` turns the spec into a Hypothesis state
machine with one rule per event, so an event added to the spec is a rule the next run, and
`missing_drivers()` names the events nobody drives yet.

The reference model is the spec itself. After every action the new rows of the transition
log are replayed through it: each must be a declared edge leaving the state its record was
last in (or its lifecycle's initial state), and the replayed state of every record must equal
its stored status. On top of that every execution's program (`programs`) says what a run of it
may answer given the decisions recorded for it, so a replay after a crash must give the same
answer (`checks`).

Randomness comes through `choices.pick`: a Hypothesis `DataObject` (draws shrink), a seeded
`random.Random` (smoke runs), or None (always the first option: a deterministic walk).
Needs the `dev` extra (Hypothesis).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from lockgate.simulation.invariants import Violation
from lockgate.spec import MACHINES, MachineSpec
from lockgate.spec import ToolCallStatus as C
from tests.support.lifecycle import checks
from tests.support.lifecycle.choices import Choices, pick
from tests.support.lifecycle.client import Client
from tests.support.lifecycle.deployment import APPROVAL_TTL, Deployment
from tests.support.lifecycle.execution_drivers import (
    ExecutionActions,
    accept,
    answer_all,
    answer_one,
    cancel,
    crash_in_doubt,
    crash_interrupt,
    crash_redispatch,
    crash_requeue,
    crash_withdraw,
    decline,
    expire,
    run_asking,
    run_auto,
    run_blocked,
    run_calls,
    run_failing,
    run_journaled,
    run_pausing,
    run_tool_failure,
    run_tool_failure_journaled,
    withdraw,
)
from tests.support.lifecycle.generic_crash import crash_anywhere
from tests.support.lifecycle.instance_drivers import (
    InstanceActions,
    clean_restart,
    drain_while_running,
    graceful_restart,
    heartbeat,
    lose_instance,
)
from tests.support.lifecycle.programs import LIST_ONCE, PROGRAMS, Program
from tests.support.lifecycle.session_drivers import (
    SessionActions,
    abandon_reports,
    close_session,
    die_after_close,
    die_mid_request,
    expire_sessions,
    report_lost,
    session_request,
    set_log_level,
    stream_closed,
)
from tests.support.lifecycle.spec_replay import DRIVEN_MACHINES, SpecReplay

Driver = Callable[["Harness", Choices], None]


class Harness:
    """One simulated deployment, the client using it, and the spec replayed over its log.

    The actions live on one collaborator per driven lifecycle: `calls` (executions and their
    tool calls), `instances`, and `sessions` (sessions and the ledger of owed requests)."""

    def __init__(
        self,
        workdir: Path,
        *,
        machines: Mapping[str, MachineSpec] = MACHINES,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        self.machines = machines
        self.deployment = Deployment(workdir, settings=settings)
        self.client = Client(self.deployment)
        self.replay = SpecReplay(machines)
        self.calls = ExecutionActions(self.deployment, self.client)
        self.instances = InstanceActions(self.deployment, self.client)
        self.sessions = SessionActions(self.deployment, self.client, self.instances)
        #: The known executions paused when the harness last settled.
        self.waiting: list[str] = []
        try:
            self.settle()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.deployment.close()

    @property
    def executions(self) -> dict[str, Program]:
        """Execution id -> what the client knows of it, in the order it learned them."""
        return self.client.executions

    @property
    def observed(self) -> Counter[tuple[str, str]]:
        """(machine, event) -> how many times the log showed it (coverage)."""
        return self.replay.observed

    def settle(self) -> None:
        """What the instances' background loops do between requests (see
        `Deployment.run_background`); then the new transitions are replayed through the
        spec."""
        self.deployment.run_background()
        self.client.discover()
        self.replay.replay(self.deployment.engine)
        self.waiting = self.client.paused()

    def advance(self, delta: timedelta) -> None:
        self.deployment.advance(delta)

    # -- what the invariants read ------------------------------------------------------------

    def model_disagreements(self) -> list[str]:
        """Where the reference model and the database disagree (with every replay error)."""
        return self.replay.disagreements(self.deployment.engine)

    def wrong_answers(self) -> list[str]:
        """Client-level problems, and every known execution whose stored answer is not what
        its program gives for the decisions recorded."""
        return checks.wrong_answers(self.deployment.engine, self.client)

    def violations(self) -> list[Violation]:
        """`simulation.invariants.check_all` on what is persisted (see `checks.violations`)."""
        return checks.violations(self.deployment, self.client)

    def report(self, problems: Sequence[object], records: Sequence[str] = ()) -> str:
        """A failure message: the problems, what the harness did, and the records' history."""
        return checks.report(self.deployment, problems, records)


# -- the drivers -------------------------------------------------------------------------------

DRIVERS: Mapping[tuple[str, str], Driver] = {
    ("execution", "start"): run_auto,
    ("execution", "checkpoint"): run_journaled,
    ("execution", "complete"): run_auto,
    ("execution", "fail"): run_failing,
    ("execution", "pause"): run_pausing,
    ("execution", "resume"): accept,
    ("execution", "expire"): expire,
    ("execution", "cancel"): cancel,
    ("execution", "hand_back"): drain_while_running,
    ("execution", "requeue"): crash_requeue,
    ("execution", "interrupt"): crash_interrupt,
    ("tool_call", "auto_approve"): run_journaled,
    ("tool_call", "request_approval"): run_pausing,
    ("tool_call", "block"): run_blocked,
    ("tool_call", "approve"): accept,
    ("tool_call", "decline"): decline,
    ("tool_call", "expire"): expire,
    ("tool_call", "withdraw"): withdraw,
    ("tool_call", "dispatch"): run_journaled,
    ("tool_call", "succeed"): run_journaled,
    ("tool_call", "fail"): run_tool_failure_journaled,
    ("tool_call", "succeed_at_least_once"): run_calls,
    ("tool_call", "fail_at_least_once"): run_tool_failure,
    ("tool_call", "withdraw_on_crash"): crash_withdraw,
    ("tool_call", "redispatch"): crash_redispatch,
    ("tool_call", "mark_in_doubt"): crash_in_doubt,
    ("tool_call", "ask"): run_asking,
    ("tool_call", "take_answers"): answer_one,
    ("tool_call", "answer"): answer_all,
    ("instance", "heartbeat"): heartbeat,
    ("instance", "drain"): graceful_restart,
    ("instance", "stop"): graceful_restart,
    ("instance", "declare_dead"): lose_instance,
    ("session", "begin_request"): session_request,
    ("session", "end_request"): session_request,
    ("session", "destroy"): expire_sessions,
    ("session", "close"): close_session,
    ("session", "set_log_level"): set_log_level,
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


def _has_approvals(h: Harness) -> bool:
    return bool(h.client.awaiting(C.AWAITING_APPROVAL))


#: When a driver can do something at all (it does nothing otherwise); the generated rules
#: use these as preconditions, so no step is spent on a rule that cannot act.
PRECONDITIONS: Mapping[tuple[str, str], Callable[[Harness], bool]] = {
    ("execution", "resume"): _has_approvals,
    ("execution", "expire"): _has_paused,
    ("tool_call", "approve"): _has_approvals,
    ("tool_call", "decline"): _has_approvals,
    ("tool_call", "expire"): _has_paused,
    ("tool_call", "withdraw"): _has_paused,
}


def driven_events(machines: Mapping[str, MachineSpec] = MACHINES) -> list[tuple[str, str]]:
    """(machine, event) for every event of the driven lifecycles, in spec order."""
    return [(m, e) for m in DRIVEN_MACHINES if m in machines for e in machines[m].events()]


def missing_drivers(machines: Mapping[str, MachineSpec] = MACHINES) -> list[tuple[str, str]]:
    """The spec events of the driven lifecycles that no driver makes happen."""
    return [key for key in driven_events(machines) if key not in DRIVERS]


# What tests import from here; the rest lives in the modules named in the docstring.
__all__ = [
    "APPROVAL_TTL",
    "DRIVERS",
    "LIST_ONCE",
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
    "run_pausing",
]
