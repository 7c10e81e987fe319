"""The runner that bridges the event loop and the engine's worker threads, in process.

A refused resume (already settled, forbidden, ...) is an ordinary, answered outcome. It must
not leave an asyncio future whose exception nobody retrieved: asyncio then logs "Future
exception was never retrieved" at level error (with the exception's message) whenever the
garbage collector gets to it, which over HTTP is at some unpredictable later moment. Here the
collection is forced, so the check is deterministic.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from machine.engine import Action
from machine.execution_errors import ExecutionAlreadySettled, LimitReached
from server.runner import ExecutionRunner
from server.shapes import Running


def refused() -> ExecutionAlreadySettled:
    return ExecutionAlreadySettled(execution_id="e1", status="completed", detail="decided")


def unretrieved_after(budget: float, work: Any, after: Any = None) -> list[str]:
    runtime = SimpleNamespace(
        settings=SimpleNamespace(wait_budget_secs=budget, max_running_per_principal=4),
        engine=None,
    )
    runner = ExecutionRunner(runtime, workers=1)  # type: ignore[arg-type]
    messages: list[str] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: messages.append(context["message"]))
        try:
            outcome = await runner._within_budget(work, "e1")
        except ExecutionAlreadySettled:
            outcome = None
        if after is not None:
            await after(outcome)
        gc.collect()
        await asyncio.sleep(0)

    try:
        asyncio.run(scenario())
    finally:
        runner.close()
    return messages


def test_a_refusal_within_the_budget_is_retrieved() -> None:
    def work() -> None:
        raise refused()

    assert unretrieved_after(30.0, work) == []


def test_a_refusal_after_the_budget_is_retrieved() -> None:
    release = threading.Event()

    def work() -> None:
        release.wait(30)
        raise refused()

    async def after(outcome: Any) -> None:
        assert outcome == Running("e1")
        release.set()
        # Let the worker finish and its outcome reach the loop.
        await asyncio.get_running_loop().run_in_executor(None, lambda: None)
        for _ in range(20):
            await asyncio.sleep(0.01)

    assert unretrieved_after(0.05, work, after) == []


def test_work_past_the_budget_counts_until_it_really_ends() -> None:
    """The running limit counts work in its worker thread, not the client's wait: an answer
    of `running` leaves the place taken until the code is done."""
    release = threading.Event()
    resumed: list[str] = []

    def resume(execution_id: str, principal: str, *args: Any, **kwargs: Any) -> str:
        release.wait(30)
        resumed.append(execution_id)
        return execution_id

    runtime = SimpleNamespace(
        settings=SimpleNamespace(wait_budget_secs=0.05, max_running_per_principal=1),
        engine=SimpleNamespace(resume=resume),
    )
    runner = ExecutionRunner(runtime, workers=1)  # type: ignore[arg-type]

    async def scenario() -> None:
        first = await runner.resume("alice", "e1", Action.ACCEPT, None)
        assert first == Running("e1")
        assert runner.in_flight.count("alice") == 1
        with pytest.raises(LimitReached) as refused:
            await runner.resume("alice", "e2", Action.ACCEPT, None)
        assert refused.value.setting == "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL"
        assert "1 executions running" in refused.value.message
        # Alice's limit is hers: bob is admitted (his work queues for the one thread).
        assert await runner.resume("bob", "e3", Action.ACCEPT, None) == Running("e3")
        assert runner.in_flight.count("bob") == 1
        release.set()
        # One worker thread: this runs once alice's and bob's work has ended.
        await asyncio.wrap_future(runner.pool.submit(lambda: None))
        assert runner.in_flight.count("alice") == runner.in_flight.count("bob") == 0
        # Within the budget again: answered, not `running`.
        assert not isinstance(await runner.resume("alice", "e4", Action.ACCEPT, None), Running)
        assert runner.in_flight.count("alice") == 0

    try:
        asyncio.run(scenario())
    finally:
        runner.close()
    assert resumed == ["e1", "e3", "e4"]
