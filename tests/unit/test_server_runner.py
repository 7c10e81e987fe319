"""The runner that bridges the event loop and the engine's worker threads, on a real runtime
(the engine, the sandbox and the database, SQLite and PostgreSQL), through its public calls.

A refused resume (already settled, forbidden, ...) is an ordinary, answered outcome. It must
not leave an asyncio future whose exception nobody retrieved: asyncio then logs "Future
exception was never retrieved" at level error (with the exception's message) whenever the
garbage collector gets to it, which over HTTP is at some unpredictable later moment. Here the
collection is forced, so the check is deterministic.

Nothing here sleeps: work that must outlive the wait budget blocks on an event the test sets
(a tool that waits for it, or a crash-point hook that holds one write before its commit), and
"the work has ended" is observed by queueing behind it on the runner's one worker thread.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from pydantic import JsonValue
from sqlmodel import select

from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionAlreadySettled, LimitReached
from lockgate.machine.faults import Faults
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.views import ExecutionView
from lockgate.server.runner import ExecutionRunner
from lockgate.server.shapes import Running
from lockgate.spec import CrashPoint, ExecutionStatus
from tests.support.gate_tool import Gate, GateSource

MakeRuntime = Callable[..., Runtime]

#: One call that needs approval (the notes write).
WRITE = 'tools.notes.write(key="k", text="v")'
#: The decision's write: held here, before its commit, to make a resume outlive the budget.
RESUME = CrashPoint.parse("execution:resume:waiting_for_interaction->running:before_commit")
#: Long enough for any machine; reaching it fails the test (nothing waits this long).
DEADLINE = 30.0


def wait_for_event(event: threading.Event, what: str) -> None:
    if not event.wait(DEADLINE):
        pytest.fail(f"timed out after {DEADLINE:g} s waiting for {what}")


class HoldFirst(Faults):
    """Holds the first thread that reaches `point` until `release` is set (arms nothing)."""

    def __init__(self, point: CrashPoint) -> None:
        super().__init__()
        self.point = point
        self.arrived = threading.Event()
        self.release = threading.Event()
        self._held = False
        self._lock = threading.Lock()

    def reached(self, point: CrashPoint) -> None:
        super().reached(point)
        with self._lock:
            hold = point == self.point and not self._held
            self._held = self._held or hold
        if hold:
            self.arrived.set()
            wait_for_event(self.release, f"the test to release {point.name}")


def run_watching_the_loop(
    runner: ExecutionRunner, scenario: Callable[[], Awaitable[None]]
) -> list[str]:
    """Run `scenario()` (a coroutine function) on a new loop, then collect garbage there;
    every message the loop's exception handler received (none, when all is well)."""
    messages: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: messages.append(str(context["message"]))
        )
        await scenario()
        gc.collect()

    try:
        asyncio.run(main())
    finally:
        runner.close()
    return messages


async def all_work_ended(runner: ExecutionRunner) -> None:
    """With one worker thread, a job submitted now runs once every earlier job has ended
    (and their outcomes were handed to the loop before this one's)."""
    await asyncio.wrap_future(runner.pool.submit(lambda: None))


def settled_elsewhere(rt: Runtime) -> str:
    """A paused write that another decision (accept) settled: its execution id."""
    paused = rt.engine.execute("alice", WRITE)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    return paused.id


def test_a_refusal_within_the_budget_is_retrieved(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(wait_budget_secs=30.0)
    execution_id = settled_elsewhere(rt)
    assert rt.engine.resume(execution_id, "alice", Action.ACCEPT).status is (
        ExecutionStatus.COMPLETED
    )
    runner = ExecutionRunner(rt, workers=1)

    async def scenario() -> None:
        with pytest.raises(ExecutionAlreadySettled):
            await runner.resume("alice", execution_id, Action.DECLINE, None)
        assert runner.in_flight.count("alice") == 0

    assert run_watching_the_loop(runner, scenario) == []


def test_a_refusal_after_the_budget_is_retrieved(make_runtime: MakeRuntime) -> None:
    """A decline outlives the budget (held before its commit), so the client is answered
    `running`; meanwhile an accept settles the execution, and the decline, released, is
    refused in its worker thread, after nobody waits for it any more."""
    hold = HoldFirst(RESUME)
    rt = make_runtime(wait_budget_secs=0.05, faults=hold)
    execution_id = settled_elsewhere(rt)
    runner = ExecutionRunner(rt, workers=1)

    async def scenario() -> None:
        answer = await runner.resume("alice", execution_id, Action.DECLINE, None)
        assert answer == Running(execution_id)
        await asyncio.to_thread(wait_for_event, hold.arrived, "the decline to reach its commit")
        accepted = await asyncio.to_thread(rt.engine.resume, execution_id, "alice", Action.ACCEPT)
        assert accepted.status is ExecutionStatus.COMPLETED
        hold.release.set()
        await all_work_ended(runner)
        assert runner.in_flight.count("alice") == 0

    assert run_watching_the_loop(runner, scenario) == []
    # The decline really was refused (it lost the race): the accept's outcome stands.
    view = rt.engine.get(execution_id, "alice")
    assert view.status is ExecutionStatus.COMPLETED
    assert view.result == {"key": "k", "written": True}


def test_work_past_the_budget_counts_until_it_really_ends(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    """The running limit counts work in its worker thread, not the client's wait: an answer
    of `running` leaves the place taken until the code is done."""
    gate = Gate()
    rt = make_runtime(
        wait_budget_secs=0.05,
        max_running_per_principal=1,
        sources=[NotesSource(tmp_path / "notes"), GateSource(gate)],
    )
    runner = ExecutionRunner(rt, workers=1)
    views: dict[str, ExecutionView | Running] = {}

    async def scenario() -> None:
        first = await runner.execute("alice", "tools.gate.hold()", None)
        assert isinstance(first, Running)
        await asyncio.to_thread(wait_for_event, gate.entered, "alice's code to call the gate")
        assert runner.in_flight.count("alice") == 1
        with pytest.raises(LimitReached) as refused:
            await runner.execute("alice", "'never stored'", None)
        assert refused.value.setting == "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL"
        assert "1 executions running" in refused.value.message
        # Alice's limit is hers: bob is admitted (his work queues for the one thread).
        second = await runner.execute("bob", "6 * 7", None)
        assert isinstance(second, Running)
        assert runner.in_flight.count("bob") == 1
        gate.opened.set()
        await all_work_ended(runner)
        assert runner.in_flight.count("alice") == runner.in_flight.count("bob") == 0
        views["alice"] = rt.engine.get(first.execution_id, "alice")
        views["bob"] = rt.engine.get(second.execution_id, "bob")
        # Admitted again, and (a budget no machine outlives for this) answered in it.
        runner.budget = DEADLINE
        views["again"] = await runner.execute("alice", "1 + 1", None)
        assert runner.in_flight.count("alice") == 0

    assert run_watching_the_loop(runner, scenario) == []
    assert {name: view_outcome(view) for name, view in views.items()} == {
        "alice": (ExecutionStatus.COMPLETED, "opened"),
        "bob": (ExecutionStatus.COMPLETED, 42),
        "again": (ExecutionStatus.COMPLETED, 2),
    }
    with rt.engine.store.session() as s:
        codes = sorted(row.code for row in s.exec(select(Execution)))
    assert codes == ["1 + 1", "6 * 7", "tools.gate.hold()"], "the refused call stored nothing"


def view_outcome(view: ExecutionView | Running) -> tuple[ExecutionStatus, JsonValue]:
    assert isinstance(view, ExecutionView), view
    return view.status, view.result


def test_a_keyed_repeat_at_the_paused_limit_is_attached_not_refused(
    make_runtime: MakeRuntime,
) -> None:
    """At the paused limit a new `execute` is refused, but the retry of one that already
    started (same idempotency key, same code) starts nothing, so no limit applies: it is
    answered with the paused execution it started."""
    rt = make_runtime(wait_budget_secs=DEADLINE, max_paused_per_principal=1)
    runner = ExecutionRunner(rt, workers=1)
    answers: dict[str, ExecutionView | Running] = {}

    async def scenario() -> None:
        answers["first"] = await runner.execute("alice", WRITE, None, idempotency_key="k1")
        with pytest.raises(LimitReached) as refused:
            await runner.execute("alice", WRITE, None, idempotency_key="k2")
        assert refused.value.setting == "LOCKGATE_MAX_PAUSED_PER_PRINCIPAL"
        answers["again"] = await runner.execute("alice", WRITE, None, idempotency_key="k1")
        assert runner.in_flight.count("alice") == 0

    assert run_watching_the_loop(runner, scenario) == []
    first, again = answers["first"], answers["again"]
    assert isinstance(first, ExecutionView) and isinstance(again, ExecutionView)
    assert first.status is again.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert again.id == first.id
    with rt.engine.store.session() as s:
        assert len(s.exec(select(Execution)).all()) == 1, "the refused call stored nothing"
