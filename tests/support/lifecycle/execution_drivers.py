"""How the harness makes the execution and tool_call lifecycles' events happen.

`ExecutionActions` does what a client or a person does to an execution: run code (through
`execute`, or `submit` then `run`), decide on a paused call, cancel, let an approval deadline
pass, or any of these with one of the spec's crash points armed. The driver functions below
choose the program and the action for one spec event; `tests.support.harness.DRIVERS` maps
the events to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionExpired
from lockgate.machine.runtime import Runtime
from lockgate.spec import MACHINES, CrashPoint, every_crash_point
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C
from tests.support.lifecycle.choices import Choices, pick, pick_int
from tests.support.lifecycle.client import Client
from tests.support.lifecycle.deployment import APPROVAL_TTL, PRINCIPAL, Deployment
from tests.support.lifecycle.programs import (
    ANSWERS,
    AUTO_PROGRAMS,
    CALLING_PROGRAMS,
    COMPOSE,
    DELETE_BLOCKED,
    FAILING_PROGRAMS,
    LIST_ONCE,
    LIST_TWICE,
    PAUSING_PROGRAMS,
    TOOL_FAILURE_PROGRAMS,
    Program,
)

if TYPE_CHECKING:
    from tests.support.harness import Harness


class ExecutionActions:
    """A client's and a person's actions on executions, on whichever instance they land."""

    def __init__(self, deployment: Deployment, client: Client) -> None:
        self.deployment = deployment
        self.client = client

    def execute(self, data: Choices, program: Program, *, retries: bool = True) -> None:
        """Run `program`: through `execute` (stored and claimed in one transaction, run until
        it ends or pauses), or queued with `submit` and claimed by `run`. With `retries`
        off the instance runs as one set to `conservative_recovery` does: every call is
        journaled intent first, reads too (with retries on, a read the policy approves is
        made at once and journaled with the next durable commit)."""
        d, known = self.deployment, self.client.executions
        runtime = d.pick_runtime(data)
        how = pick(data, ["execute", "submit"], "how the code is started")
        name = runtime.settings.instance_name

        def run() -> None:
            d.note(f"{name}: {how} {program.name}{'' if retries else ', retries off'}")
            with retries_off(runtime, not retries):
                if how == "execute":
                    execution_id = runtime.engine.execute(PRINCIPAL, program.code).id
                    known.setdefault(execution_id, program)
                else:
                    execution_id = runtime.engine.submit(PRINCIPAL, program.code)
                    known[execution_id] = program
                    runtime.engine.run(execution_id)
            d.note(f"{name}: {program.name} is {execution_id}")

        d.act(runtime, run)

    def decide(self, data: Choices, action: Action) -> None:
        """A person's decision on a paused execution (nothing when none is paused)."""
        d, client = self.deployment, self.client
        paused = client.awaiting(C.AWAITING_APPROVAL)
        if not paused:
            return
        execution_id = pick(data, paused, "paused execution")
        runtime = d.pick_runtime(data)

        def resume() -> None:
            d.note(f"{runtime.settings.instance_name}: resume {execution_id} {action}")
            try:
                runtime.engine.resume(execution_id, PRINCIPAL, action)
            except ExecutionExpired:
                if not client.overdue(execution_id):
                    client.problems.append(
                        f"resume of {execution_id} said expired before its deadline"
                    )

        d.act(runtime, resume)

    def answer(self, data: Choices, *, every: bool) -> None:
        """Answer what a paused call's tool asked: every open question at once, or one of
        them (nothing when no call asks)."""
        d, client = self.deployment, self.client
        asking = client.awaiting(C.AWAITING_INPUT)
        if not asking:
            return
        execution_id = pick(data, asking, "asking execution")
        runtime = d.pick_runtime(data)

        def give() -> None:
            pending = runtime.engine.get(execution_id, PRINCIPAL).pending
            open_keys = sorted((pending.questions or {}) if pending is not None else {})
            keys = open_keys if every or not open_keys else [pick(data, open_keys, "question")]
            d.note(f"{runtime.settings.instance_name}: answer {execution_id} {keys}")
            try:
                runtime.engine.answers.give(execution_id, PRINCIPAL, {k: ANSWERS[k] for k in keys})
            except ExecutionExpired:
                if not client.overdue(execution_id):
                    client.problems.append(
                        f"answers to {execution_id} said expired before its deadline"
                    )

        d.act(runtime, give)

    def cancel(self, data: Choices, *, queued: bool) -> None:
        """Cancel a queued execution (submitted, not yet run), or a paused one."""
        d, client = self.deployment, self.client
        runtime = d.pick_runtime(data)
        if queued:

            def cancel_queued() -> None:
                execution_id = runtime.engine.submit(PRINCIPAL, LIST_ONCE.code)
                client.executions[execution_id] = LIST_ONCE
                d.note(f"{runtime.settings.instance_name}: submit+cancel {execution_id}")
                view = runtime.engine.cancel(execution_id, PRINCIPAL)
                if view.status != E.CANCELLED:
                    client.problems.append(f"cancel of queued {execution_id} left it {view.status}")

            d.act(runtime, cancel_queued)
            return
        paused = client.paused()
        if not paused:
            return
        execution_id = pick(data, paused, "paused execution")

        def cancel_paused() -> None:
            d.note(f"{runtime.settings.instance_name}: cancel {execution_id}")
            overdue = client.overdue(execution_id)
            try:
                status = runtime.engine.cancel(execution_id, PRINCIPAL).status
            except ExecutionExpired:
                status = E.EXPIRED
            if status != E.CANCELLED and not (overdue and status == E.EXPIRED):
                client.problems.append(f"cancel of paused {execution_id} left it {status}")

        d.act(runtime, cancel_paused)

    def expire(self, data: Choices) -> None:
        """Let the approval deadline pass, then find it: by the sweep, a maintenance round,
        a client reading the execution, or a late decision."""
        d, problems = self.deployment, self.client.problems
        paused = self.client.paused()
        if not paused:
            return
        d.advance(APPROVAL_TTL + timedelta(seconds=1))
        how = pick(data, ["sweep", "maintain", "read", "resume"], "how the expiry is found")
        runtime = d.pick_runtime(data)
        execution_id = pick(data, paused, "paused execution")

        def find() -> None:
            d.note(f"{runtime.settings.instance_name}: expiry found by {how}")
            if how == "sweep":
                runtime.engine.expire_due()
            elif how == "maintain":
                runtime.maintain()
            elif how == "read":
                view = runtime.engine.get(execution_id, PRINCIPAL)
                if view.status != E.EXPIRED:
                    problems.append(f"{execution_id} is {view.status} past its deadline")
            else:
                try:
                    runtime.engine.resume(execution_id, PRINCIPAL, Action.ACCEPT)
                except ExecutionExpired:
                    return
                problems.append(f"{execution_id} was resumed past its deadline")

        d.act(runtime, find)

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
        with self.deployment.armed([point], skip=skip, conservative=conservative):
            action()


# -- the crash points the crash drivers arm ----------------------------------------------------


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


#: Crash points inside a run of auto-approved idempotent calls made at once (LIST_ONCE,
#: LIST_TWICE, retries on): nothing of a call is stored before the end, so recovery finds
#: the execution running with no call and requeues it.
REQUEUE_POINTS = (
    *_points("execution", "start", "after_commit"),
    *_points("tool_call", "succeed_at_least_once", "after_effect", "before_commit"),
    *_points("execution", "complete", "before_commit"),
)
#: The same run with retries off (every call journaled intent first): every call is
#: settled, or sent and safe to send again once retries are back on, so recovery (with
#: retries on) requeues it.
JOURNALED_REQUEUE_POINTS = (
    *_points("execution", "checkpoint"),
    *_points("tool_call", "auto_approve"),
    *_points("tool_call", "dispatch"),
    *_points("tool_call", "succeed"),
)
#: After the intent was committed and before the result was: the call may have run.
DISPATCHED_POINTS = (
    *_points("tool_call", "dispatch", "after_commit", "after_effect"),
    *_points("tool_call", "succeed", "before_commit"),
)
#: A person's accept committed, the call not sent yet: it rests approved. (A new call's
#: row commits with its policy's decision, so no other call rests unsent.)
UNSENT_POINTS = (
    *_points("tool_call", "approve", "after_commit"),
    *_points("execution", "resume", "after_commit"),
    *_points("tool_call", "dispatch", "before_commit"),
)


@contextmanager
def retries_off(runtime: Runtime, off: bool = True) -> Iterator[None]:
    """`runtime` runs the action inside as an instance set to `conservative_recovery` does
    (its write path asks the spec's `retry_allowed` with it); as it was afterwards."""
    before = runtime.engine.write.conservative
    runtime.engine.write.conservative = before or off
    try:
        yield
    finally:
        runtime.engine.write.conservative = before


def _later_calls(program: Program) -> int:
    return 1 if program is LIST_TWICE else 0


# -- the drivers -------------------------------------------------------------------------------


def run_auto(h: Harness, data: Choices) -> None:
    """Code that runs to its end without asking anyone: start, complete."""
    h.calls.execute(data, pick(data, AUTO_PROGRAMS, "program"))


def run_calls(h: Harness, data: Choices) -> None:
    """Code whose reads the policy approves, made at once: succeed_at_least_once."""
    h.calls.execute(data, pick(data, CALLING_PROGRAMS, "program"))


def run_journaled(h: Harness, data: Choices) -> None:
    """The same code with retries off, every call journaled intent first: checkpoint,
    auto_approve, dispatch, succeed."""
    h.calls.execute(data, pick(data, CALLING_PROGRAMS, "program"), retries=False)


def run_failing(h: Harness, data: Choices) -> None:
    h.calls.execute(data, pick(data, FAILING_PROGRAMS, "program"))


def run_tool_failure(h: Harness, data: Choices) -> None:
    """A read that fails inside the code, made at once: fail_at_least_once."""
    h.calls.execute(data, pick(data, TOOL_FAILURE_PROGRAMS, "program"))


def run_tool_failure_journaled(h: Harness, data: Choices) -> None:
    """The same with retries off, the read journaled intent first: fail."""
    h.calls.execute(data, pick(data, TOOL_FAILURE_PROGRAMS, "program"), retries=False)


def run_blocked(h: Harness, data: Choices) -> None:
    h.calls.execute(data, DELETE_BLOCKED)


def run_pausing(h: Harness, data: Choices) -> None:
    h.calls.execute(data, pick(data, PAUSING_PROGRAMS, "program"))


def run_asking(h: Harness, data: Choices) -> None:
    """Code whose tool asks its user before it acts: ask."""
    h.calls.execute(data, COMPOSE)


def answer_one(h: Harness, data: Choices) -> None:
    """One of a call's two questions answered (asked first when nothing asks): take_answers."""
    if not h.client.awaiting(C.AWAITING_INPUT):
        run_asking(h, data)
    h.calls.answer(data, every=False)


def answer_all(h: Harness, data: Choices) -> None:
    """What is still open answered at once (asked first when nothing asks): answer."""
    if not h.client.awaiting(C.AWAITING_INPUT):
        run_asking(h, data)
    h.calls.answer(data, every=True)


def accept(h: Harness, data: Choices) -> None:
    h.calls.decide(data, Action.ACCEPT)


def decline(h: Harness, data: Choices) -> None:
    h.calls.decide(data, pick(data, [Action.DECLINE, Action.CANCEL], "decision"))


def expire(h: Harness, data: Choices) -> None:
    h.calls.expire(data)


def cancel(h: Harness, data: Choices) -> None:
    queued = not h.client.paused() or pick(data, [False, True], "cancel a queued execution")
    h.calls.cancel(data, queued=queued)


def withdraw(h: Harness, data: Choices) -> None:
    h.calls.cancel(data, queued=False)


def crash_requeue(h: Harness, data: Choices) -> None:
    """Crash while auto-approved calls run (made at once, or journaled first with retries
    off); recovery requeues, the next run goes on from the last checkpoint."""
    program = pick(data, [LIST_TWICE, LIST_ONCE], "program")
    if pick(data, ["at once", "journaled"], "how the calls are made") == "at once":
        h.calls.crash_during(
            data,
            REQUEUE_POINTS,
            lambda: h.calls.execute(data, program),
            max_skip=_later_calls(program),
        )
        return
    h.calls.crash_during(
        data,
        JOURNALED_REQUEUE_POINTS,
        lambda: h.calls.execute(data, program, retries=False),
        max_skip=_later_calls(program),
    )


def crash_redispatch(h: Harness, data: Choices) -> None:
    """Crash with an idempotent call dispatched (sent intent first, with retries off); the
    next incarnation, retries on, calls it again with the same key."""
    program = pick(data, [LIST_ONCE, LIST_TWICE], "program")
    h.calls.crash_during(
        data,
        DISPATCHED_POINTS,
        lambda: h.calls.execute(data, program, retries=False),
        max_skip=_later_calls(program),
    )


def crash_in_doubt(h: Harness, data: Choices) -> None:
    """Crash with a call dispatched that may not be repeated: an approved write, or any call
    under conservative recovery. It ends in doubt and its execution interrupted."""
    approvable = h.client.awaiting(C.AWAITING_APPROVAL)
    options = ["conservative", "approved write"] if approvable else ["conservative"]
    if pick(data, options, "what is in doubt") == "approved write":
        h.calls.crash_during(data, DISPATCHED_POINTS, lambda: h.calls.decide(data, Action.ACCEPT))
    else:
        program = pick(data, [LIST_ONCE, LIST_TWICE], "program")
        h.calls.crash_during(
            data,
            DISPATCHED_POINTS,
            lambda: h.calls.execute(data, program, retries=False),
            conservative=True,
        )


def crash_interrupt(h: Harness, data: Choices) -> None:
    """A crash recovery may not go on from: a call in doubt, or conservative recovery."""
    if pick(data, ["in doubt", "conservative"], "why it is interrupted") == "in doubt":
        crash_in_doubt(h, data)
        return
    program = pick(data, [LIST_TWICE, LIST_ONCE], "program")
    h.calls.crash_during(
        data, REQUEUE_POINTS, lambda: h.calls.execute(data, program), conservative=True
    )


def crash_withdraw(h: Harness, data: Choices) -> None:
    """Crash after a person's accept and before the call was sent, recovered
    conservatively: the execution is interrupted and its approved call withdrawn."""
    if not h.client.awaiting(C.AWAITING_APPROVAL):
        h.calls.execute(data, pick(data, PAUSING_PROGRAMS, "program"))
    h.calls.crash_during(
        data, UNSENT_POINTS, lambda: h.calls.decide(data, Action.ACCEPT), conservative=True
    )
