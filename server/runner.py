"""Runs engine work off the event loop, within the client's wait budget.

Agent code runs in worker threads. A call that outlives the budget answers `running` and the
execution carries on; `wait` picks up its outcome later from any instance (the row is the
truth, so waiting works across sessions, restarts and instances).

Admission: one principal may have `max_running_per_principal` pieces of execute/resume work
in flight on this instance (counted until the worker thread's work really ends, not until the
wait budget runs out) and `max_paused_per_principal` unfinished executions (waiting for
approval, or running and so able to pause) across all instances, counted in the transaction
that inserts a new one; beyond either, the call is refused with `limit_reached` before
anything is stored or decided.

On SIGTERM the runtime hands running executions back (see `Runtime.drain`); the worker
threads are daemons, so one still in a tool call when the drain's bound passes does not hold
the process (its execution is recovery's then).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from anyio import to_thread
from pydantic import JsonValue

from lockgate.machine.approval_audit import Decider
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import LimitReached
from lockgate.machine.execution_reads import AlreadyStarted
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.call_notices import Listener
from lockgate.machine.views import ExecutionView
from lockgate.server.shapes import Running
from lockgate.spec import ExecutionStatus as E

T = TypeVar("T")
#: How often `wait` looks at an execution another thread or instance is running.
POLL_SECONDS = 0.2


class InFlight:
    """Engine work in flight on this instance, per principal, bounded by `limit`.

    `claim` happens on the event loop, `release` in the worker thread that did the work."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def claim(self, principal: str) -> None:
        """Count one more piece of work for `principal`; LimitReached when at the limit."""
        with self._lock:
            held = self._counts.get(principal, 0)
            if held >= self.limit:
                raise LimitReached.running(self.limit)
            self._counts[principal] = held + 1

    def release(self, principal: str) -> None:
        with self._lock:
            held = self._counts.get(principal, 0) - 1
            if held > 0:
                self._counts[principal] = held
            else:
                self._counts.pop(principal, None)

    def count(self, principal: str) -> int:
        with self._lock:
            return self._counts.get(principal, 0)


class DaemonThreads:
    """At most `limit` daemon threads running submitted jobs in order (first in, first out).

    Not a ThreadPoolExecutor: its threads are joined when the interpreter exits, so a thread
    still in a tool call after the drain's bound would keep the process up until the
    platform's SIGKILL. Here the drain decides how long to wait (`close`)."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit, self.name = limit, name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: Threads waiting for a job (each will take one more from the queue).
        self._idle = 0
        self._closed = False

    def submit(self, job: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the execution runner is closed")
            self._jobs.put((future, job))
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.limit:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job = item
            if future.set_running_or_notify_cancel():
                try:
                    result = job()
                except BaseException as exc:  # the future carries it to whoever waits
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            with self._lock:
                self._idle += 1

    def close(self, timeout: float | None = None) -> bool:
        """Take no more jobs; the queued ones still run (while draining they hand their
        executions back at once). Wait up to `timeout` seconds (None: until done) for every
        thread to finish; False if some did not."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)


class ExecutionRunner:
    #: Threads here mostly wait (for a fair sandbox slot, a tool, the database), so they are
    #: cheap: 64 lets 16 principals each at the default running limit (4) go on before any
    #: other principal's work queues for a thread.
    def __init__(self, runtime: Runtime, *, workers: int = 64) -> None:
        self.runtime = runtime
        settings = runtime.settings
        self.budget = settings.wait_budget_secs
        self.in_flight = InFlight(settings.max_running_per_principal)
        self.pool = DaemonThreads(workers, "lockgate-exec")

    async def _within_budget(
        self,
        work: Callable[[], ExecutionView],
        execution_id: str,
        principal: str | None = None,
        budget: float | None = None,
    ) -> ExecutionView | Running:
        """Run `work` in a worker thread, answering `running` past the budget. With
        `principal`, the work holds one of its claimed in-flight places (see `InFlight`),
        released when the work ends."""
        job = work if principal is None else self._releasing(principal, work)
        # The request's context goes with the work (its span, which a decision links to).
        context = contextvars.copy_context()
        try:
            future = self.pool.submit(lambda: context.run(job))
        except BaseException:
            if principal is not None:
                self.in_flight.release(principal)
            raise
        wrapped = asyncio.wrap_future(future)
        done, _ = await asyncio.wait({wrapped}, timeout=self.budget if budget is None else budget)
        if not done:
            # The thread goes on and the row will tell; its outcome is read (and dropped)
            # when it ends, so asyncio has nothing to complain about.
            wrapped.add_done_callback(lambda f: f.cancelled() or f.exception())
            return Running(execution_id)
        return wrapped.result()

    def _releasing(
        self, principal: str, work: Callable[[], ExecutionView]
    ) -> Callable[[], ExecutionView]:
        def job() -> ExecutionView:
            try:
                return work()
            finally:
                self.in_flight.release(principal)

        return job

    async def execute(
        self,
        principal: str,
        code: str,
        session_id: str | None,
        origin: str | None = None,
        idempotency_key: str | None = None,
        *,
        budget: float | None = None,
        direct_tool: str | None = None,
        listener: Listener | None = None,
    ) -> ExecutionView | Running:
        """Start and run new code; with `idempotency_key`, a call that repeats one which
        already started an execution waits for that execution instead (a retry of a lost
        `execute` is attached to it: no second execution, no limit spent). `budget`: how
        long to wait for an outcome (default: the wait budget; 0 for a task, which answers
        once the execution is stored). `listener` hears what its tools say while this waits
        (`machine.tools.call_notices`)."""
        engine = self.runtime.engine
        self.in_flight.claim(principal)
        try:
            claimed = await to_thread.run_sync(
                lambda: engine.begin(
                    principal,
                    code,
                    session_id,
                    origin,
                    idempotency_key,
                    # Exact under any concurrency: counted where the execution is inserted.
                    live_limit=self.runtime.settings.max_paused_per_principal,
                    direct_tool=direct_tool,
                )
            )
        except AlreadyStarted as started:
            self.in_flight.release(principal)
            return await self.wait(principal, started.execution_id)
        except BaseException:
            self.in_flight.release(principal)
            raise
        if listener is None:
            return await self._within_budget(
                lambda: engine.carry_on(claimed), claimed.id, principal, budget
            )
        # Before the code runs: its first call's notices are heard too.
        with engine.dispatcher.notices.listening(claimed.id, listener):
            return await self._within_budget(
                lambda: engine.carry_on(claimed), claimed.id, principal, budget
            )

    async def resume(
        self,
        principal: str,
        execution_id: str,
        action: Action,
        content: JsonValue,
        *,
        expected_call: int | None = None,
        decided_by: Decider | None = None,
    ) -> ExecutionView | Running:
        engine = self.runtime.engine
        self.in_flight.claim(principal)
        return await self._within_budget(
            lambda: engine.resume(
                execution_id,
                principal,
                action,
                content,
                expected_call=expected_call,
                decided_by=decided_by,
            ),
            execution_id,
            principal,
        )

    async def answer(
        self,
        principal: str,
        execution_id: str,
        responses: Mapping[str, JsonValue],
        *,
        expected_call: int | None = None,
        budget: float | None = None,
    ) -> ExecutionView | Running:
        """Answers to what the paused call's tool asked (`machine.call_answers`); once the
        last one is in, the execution runs on, within the budget (`budget`: another). The
        answers are stored, or refused, before this returns, whatever the budget: a client
        told `running` (or a task's update acknowledged) reads them back at once."""
        engine = self.runtime.engine
        self.in_flight.claim(principal)
        try:
            view, go_on = await to_thread.run_sync(
                lambda: engine.answers.take(
                    execution_id, principal, responses, expected_call=expected_call
                )
            )
        except BaseException:
            self.in_flight.release(principal)
            raise
        if go_on is None:
            self.in_flight.release(principal)
            return view

        def run_on() -> ExecutionView:
            go_on()
            return engine.get(execution_id, principal)

        # The place claimed above passes to the work that runs the code on.
        return await self._within_budget(run_on, execution_id, principal, budget)

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
        """Wait for the work in flight: until it ends, or while the runtime drains, until the
        drain's bound (what is still running then is left behind; see DaemonThreads)."""
        self.pool.close(timeout=self.runtime.drain_left())
