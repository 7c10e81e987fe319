"""Runs engine work off the event loop, within the client's wait budget.

Agent code runs in worker threads. A call that outlives the budget answers `running` and the
execution carries on; `wait` picks up its outcome later from any instance (the row is the
truth, so waiting works across sessions, restarts and instances).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from anyio import to_thread
from pydantic import JsonValue

from machine.engine import Action
from machine.runtime import Runtime
from machine.views import ExecutionView
from server.shapes import Running
from spec import ExecutionStatus as E

T = TypeVar("T")
#: How often `wait` looks at an execution another thread or instance is running.
POLL_SECONDS = 0.2


class ExecutionRunner:
    def __init__(self, runtime: Runtime, *, workers: int = 16) -> None:
        self.runtime = runtime
        self.budget = runtime.settings.wait_budget_secs
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, "lockgate-exec")

    async def _within_budget(
        self, work: Callable[[], ExecutionView], execution_id: str
    ) -> ExecutionView | Running:
        wrapped = asyncio.wrap_future(self.pool.submit(work))
        done, _ = await asyncio.wait({wrapped}, timeout=self.budget)
        if not done:
            # The thread goes on and the row will tell; its outcome is read (and dropped)
            # when it ends, so asyncio has nothing to complain about.
            wrapped.add_done_callback(lambda f: f.cancelled() or f.exception())
            return Running(execution_id)
        return wrapped.result()

    async def execute(
        self, principal: str, code: str, session_id: str | None, origin: str | None = None
    ) -> ExecutionView | Running:
        engine = self.runtime.engine
        claimed = await to_thread.run_sync(engine.begin, principal, code, session_id, origin)
        return await self._within_budget(lambda: engine.carry_on(claimed), claimed.id)

    async def resume(
        self,
        principal: str,
        execution_id: str,
        action: Action,
        content: JsonValue,
        *,
        expected_call: int | None = None,
    ) -> ExecutionView | Running:
        engine = self.runtime.engine
        return await self._within_budget(
            lambda: engine.resume(
                execution_id, principal, action, content, expected_call=expected_call
            ),
            execution_id,
        )

    async def wait(self, principal: str, execution_id: str) -> ExecutionView | Running:
        """The execution's outcome, waiting up to the budget while it is running."""
        engine = self.runtime.engine
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget
        while True:
            view = await to_thread.run_sync(engine.get, execution_id, principal)
            if view.status not in (E.RUNNING, E.PENDING):
                return view
            if loop.time() >= deadline:
                return Running(execution_id)
            await asyncio.sleep(POLL_SECONDS)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=False)
