"""A SIGTERM drain is bounded: running work is handed back, not waited for.

The drain stops the code running in the sandbox at once and puts each running execution back
to `pending` (the spec's `hand_back`), released by its owner, to go on from its last
checkpoint on the next owner. A tool call already dispatched is carried to its result first;
past the drain's bound (`LOCKGATE_DRAIN_TIMEOUT`) it is left to recovery.

The engine-level tests drive a real runtime (sandbox, database, both kinds); the last one
drives real `lockgate serve` processes: SIGTERM while code runs, exit 0 within the bound, and
a restart under the same instance name runs the execution again to its result.

Nothing sleeps to wait: running code is seen by the sandbox's count of steps in flight (or a
tool that blocks on an event), other processes by polling with a deadline.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Execution, ToolCall, TransitionLog
from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox import Finished, Sandbox, SandboxLimits, SandboxStopped
from lockgate.machine.tools.notes import NotesSource
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C
from tests.support.gate_tool import Gate, GateSource
from tests.support.polling import wait_for
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    run,
    settle,
    structured,
)
from tests.support.threads import InThread

#: The fixtures (`deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

MakeRuntime = Callable[..., Runtime]
#: Nothing here waits this long unless the code under test is broken.
DEADLINE = 30.0


def loop(iterations: int) -> str:
    """Pure computation (Monty runs ~10 million of these iterations a second)."""
    return f"total = 0\nfor i in range({iterations}):\n    total = total + i\ntotal"


def total(iterations: int) -> int:
    return iterations * (iterations - 1) // 2


#: About a second of pure code: ample time to see it running and drain it.
SECOND = 10_000_000


def wait_running(sandbox: Sandbox) -> None:
    """Until a step is in flight in a sandbox worker (the code is running, not starting)."""
    wait_for(sandbox.running, "the code to start running in the sandbox", DEADLINE, 0.001)


def events(runtime: Runtime, execution_id: str) -> list[str]:
    with runtime.engine.store.session() as s:
        rows = s.exec(
            select(TransitionLog)
            .where(TransitionLog.record_id == execution_id)
            .order_by(col(TransitionLog.id))
        )
        return [row.event for row in rows]


def row_of(runtime: Runtime, execution_id: str) -> Execution:
    with runtime.engine.store.session() as s:
        row = s.get(Execution, execution_id)
    assert row is not None
    return row


def calls_of(runtime: Runtime, execution_id: str) -> list[tuple[int, str]]:
    with runtime.engine.store.session() as s:
        rows = s.exec(
            select(ToolCall)
            .where(ToolCall.execution_id == execution_id)
            .order_by(col(ToolCall.seq))
        )
        return [(c.seq, c.status) for c in rows]


# -- the sandbox ------------------------------------------------------------------------------


def test_stopping_the_sandbox_abandons_the_running_step_and_refuses_new_ones() -> None:
    with Sandbox({"notes": ["list"]}, SandboxLimits(max_duration_secs=60)) as sandbox:
        running = InThread(lambda: sandbox.start(loop(50 * SECOND), principal="p"))
        wait_running(sandbox)
        started = time.monotonic()
        assert sandbox.stop() == 1
        with pytest.raises(SandboxStopped):
            running.result()
        assert time.monotonic() - started < 5, "the step ran on after stop"
        assert sandbox.running() == 0
        with pytest.raises(SandboxStopped):
            sandbox.start("1", principal="p")


def test_a_step_that_ends_before_the_stop_keeps_its_outcome() -> None:
    with Sandbox({"notes": ["list"]}) as sandbox:
        assert sandbox.start("6 * 7", principal="p") == Finished(42, "")
        assert sandbox.stop() == 0


# -- the engine: handing back through the write path -------------------------------------------


@pytest.mark.parametrize(
    ("retries", "checkpoint"), [(False, 1), (True, None)], ids=["journaled-first", "made-at-once"]
)
def test_a_drain_hands_running_code_back_and_the_next_owner_completes_it(
    make_runtime: MakeRuntime,
    caplog: pytest.LogCaptureFixture,
    retries: bool,
    checkpoint: int | None,
) -> None:
    """Code between two tool calls is stopped; the execution goes back to pending from its
    last checkpoint, and the next owner answers the first call from the journal. With
    retries off the call was journaled first (the checkpoint is at the call); otherwise it
    was made at once and its journal entry commits with the hand back (the checkpoint is
    the start, and the code before the call runs again, but not the call)."""
    gate = Gate(opened=threading.Event())
    gate.opened.set()
    settings: dict[str, Any] = {
        "instance_name": "drained",
        "max_duration_secs": 60,
        "conservative_recovery": not retries,
    }
    code = f"first = tools.gate.hold()\n{loop(3 * SECOND)}\n[first, total]"
    first = make_runtime(sources=[GateSource(gate)], **settings)
    ex = first.engine.begin("alice", code)
    driving = InThread(lambda: first.engine.carry_on(ex))
    wait_for(lambda: gate.calls == 1, "the first call to be made")
    wait_running(first.sandbox)

    with caplog.at_level(logging.INFO, logger="lockgate.engine"):
        first.drain()
        driving.result()
    first.close()
    handed_back = f"execution {ex.id} handed back: it goes on from its last checkpoint"
    assert handed_back in caplog.messages

    # Had the drain waited for the code, the loop would have ended and the execution would
    # be completed: its status and events, not a stopwatch, show that it was handed back.
    assert first.sandbox.running() == 0
    row = row_of(first, ex.id)
    assert (row.status, row.owner, row.snapshot_call) == (E.PENDING, None, checkpoint)
    assert calls_of(first, ex.id) == [(1, C.SUCCEEDED)]
    took = ["start", "checkpoint", "hand_back"] if checkpoint else ["start", "hand_back"]
    assert events(first, ex.id) == took

    # The next incarnation of the same instance runs it again from the checkpoint: the
    # gate's answer comes from the journal, the loop runs again.
    second = make_runtime(sources=[GateSource(gate)], **settings)
    second.start(background=False)
    view = second.engine.get(ex.id, "alice")
    assert view.status == E.COMPLETED, view
    assert view.result == ["opened", total(3 * SECOND)]
    assert gate.calls == 1
    assert events(second, ex.id) == [*took, "start", "complete"]


def test_a_step_that_reaches_a_tool_call_while_handing_back_stores_and_sends_nothing(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    """The drain began (here without stopping the sandbox, so the step runs to its call):
    the call is neither made nor journaled (its row commits with its decision, which would
    send it), and the execution is handed back from its last checkpoint; the next owner
    runs the step again and makes the call, once."""
    notes = NotesSource(tmp_path / "notes")
    code = f"{loop(SECOND)}\nlisted = tools.notes.list()\n[total, listed]"
    first = make_runtime(sources=[notes], instance_name="drained")
    ex = first.engine.begin("alice", code)
    driving = InThread(lambda: first.engine.carry_on(ex))
    wait_running(first.sandbox)
    first.engine.handing_back.set()
    driving.result()

    row = row_of(first, ex.id)
    assert (row.status, row.owner, row.snapshot_call) == (E.PENDING, None, None)
    assert calls_of(first, ex.id) == []
    assert events(first, ex.id) == ["start", "hand_back"]
    assert [e for e in notes.effects() if e["tool"] == "notes.list"] == []

    second = make_runtime(sources=[notes], instance_name="drained")
    second.start(background=False)
    view = second.engine.get(ex.id, "alice")
    assert view.status == E.COMPLETED, view
    assert view.result == [total(SECOND), []]
    assert len([e for e in notes.effects() if e["tool"] == "notes.list"]) == 1


def test_a_call_in_flight_is_waited_for_then_the_execution_is_handed_back(
    make_runtime: MakeRuntime,
) -> None:
    """A call in flight is never handed back: the drain waits for its result (within its
    bound), then hands the execution back with the call settled in the journal (made at
    once, its entry commits with the hand back)."""
    gate = Gate()
    first = make_runtime(sources=[GateSource(gate)], instance_name="drained", drain_timeout=20)
    ex = first.engine.begin("alice", "got = tools.gate.hold()\n[got, 42]")
    driving = InThread(lambda: first.engine.carry_on(ex))
    assert gate.entered.wait(DEADLINE)
    first.drain()
    assert calls_of(first, ex.id) == []  # made at once: journaled with the next commit
    assert row_of(first, ex.id).status == E.RUNNING  # not handed back with a call out
    closing = InThread(first.close)
    gate.opened.set()
    driving.result()
    closing.result()
    assert calls_of(first, ex.id) == [(1, C.SUCCEEDED)]
    assert row_of(first, ex.id).status == E.PENDING
    assert events(first, ex.id)[-1] == "hand_back"

    second = make_runtime(sources=[GateSource(gate)], instance_name="drained")
    second.start(background=False)
    assert second.engine.get(ex.id, "alice").result == ["opened", 42]
    assert gate.calls == 1


def test_a_call_still_in_flight_at_the_bound_does_not_hold_the_stop(
    make_runtime: MakeRuntime,
) -> None:
    """Past the drain's bound, close returns with the call still out: the instance records
    its stop and the execution is left, running, for recovery (the next incarnation makes
    the idempotent call again)."""
    gate = Gate()
    first = make_runtime(sources=[GateSource(gate)], instance_name="drained", drain_timeout=0.5)
    ex = first.engine.begin("alice", "got = tools.gate.hold()\n[got, 42]")
    driving = InThread(lambda: first.engine.carry_on(ex))
    assert gate.entered.wait(DEADLINE)
    started = time.monotonic()
    first.drain()
    first.close()
    # The gate never opens before close returns, so a close that ignored the bound would
    # not return at all; the generous limit only keeps a broken build from hanging.
    assert time.monotonic() - started < DEADLINE / 3, "close waited past the drain's bound"
    assert row_of(first, ex.id).status == E.RUNNING
    assert calls_of(first, ex.id) == []

    # The next incarnation recovers the stopped one's work at once (requeued: nothing was
    # journaled since the start); the old drive's late hand back is refused (the execution
    # moved), its call's entry with it.
    second = make_runtime(sources=[GateSource(gate)], instance_name="drained")
    assert second.maintain().requeued == [ex.id]
    gate.opened.set()
    driving.result()
    assert calls_of(second, ex.id) == []
    second.engine.run_pending()
    view = second.engine.get(ex.id, "alice")
    assert view.status == E.COMPLETED, view
    assert view.result == ["opened", 42]
    assert gate.calls == 2  # at least once: the idempotent call went out again
    assert events(second, ex.id) == ["start", "requeue", "start", "complete"]


# -- a real server: SIGTERM while code runs ---------------------------------------------------

#: The bound set in the real-process test, and what the stop may take beyond it (the
#: interpreter's own start-up costs nothing here; its exit and the app's shutdown do).
DRAIN_SECS = 2.0
MARGIN_SECS = 5.0
#: About ten seconds of pure code (longer under load): more than the bound and its margin.
LONG = 100_000_000


def stored(database_url: str, execution_id: str) -> tuple[str, str | None, list[str]]:
    """The execution's status, owner and events, read as an operator would."""
    engine = open_engine(database_url)
    try:
        with Session(engine) as s:
            row = s.get(Execution, execution_id)
            assert row is not None
            log = s.exec(
                select(TransitionLog.event)
                .where(TransitionLog.record_id == execution_id)
                .order_by(col(TransitionLog.id))
            )
            return row.status, row.owner, list(log)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_sigterm_hands_running_code_back_and_a_restart_runs_it_to_its_result(
    deployment: Deployment,
) -> None:
    key = create_key_directly(deployment.database_url, "alice")
    settings = {
        "LOCKGATE_INSTANCE_NAME": "drain-test",
        "LOCKGATE_DRAIN_TIMEOUT": str(DRAIN_SECS),
        "LOCKGATE_MAX_DURATION_SECS": "120",
        "LOCKGATE_WAIT_BUDGET_SECS": "0.5",
    }
    server = deployment.start(name="first", **settings)

    async def start_long_code() -> str:
        async with mcp_client(server.url, key, "2026-07-28") as client:
            answer = structured(await client.call_tool("execute", {"code": loop(LONG)}))
            assert answer["status"] == "running", answer  # past the budget: the code runs
            return str(answer["executionId"])

    execution_id = run(start_long_code())
    assert stored(deployment.database_url, execution_id)[0] == E.RUNNING

    server.popen.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = server.wait_exit(timeout=60)
    took = time.monotonic() - started
    assert took < DRAIN_SECS + MARGIN_SECS, f"the stop took {took:.1f} s:\n{server.output()}"
    assert code == 0, server.output()
    status, owner, log = stored(deployment.database_url, execution_id)
    assert (status, owner) == (E.PENDING, None), log  # handed back, released
    assert log == ["start", "hand_back"]

    restarted = deployment.start(name="second", **settings)

    async def collect() -> dict[str, Any]:
        async with mcp_client(restarted.url, key, "legacy") as client:
            return structured(await settle(client, execution_id, timeout=120))

    final = run(collect())
    assert final["status"] == "completed", final
    assert final["result"] == total(LONG)
    # Run again from the start (it had no checkpoint), not interrupted nor failed.
    assert stored(deployment.database_url, execution_id)[2] == [
        "start",
        "hand_back",
        "start",
        "complete",
    ]
