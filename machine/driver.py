"""The driver: runs an execution's sandbox steps, on this instance, until it ends or pauses.

It claims pending executions (`run`, `run_pending`), starts or goes on from the last
checkpoint (`first_step`), and drives step after step (`drive`), handing each tool request to
the dispatcher. An unexpected error fails the execution, never the server.

A draining instance hands its running executions back (`hand_back_all`): the code running in
the sandbox is stopped, and each execution goes back to `pending` from its last checkpoint at
its next step instead of going on. A call already dispatched is carried to its result first
(it cannot be handed back in flight); everything else a drain would wait for is cut short.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from pydantic import JsonValue

from lockgate.machine import tracing
from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore
from lockgate.machine.dispatcher import (
    Dispatcher,
    ExecutionRecord,
    HandBack,
    record_of,
)
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.sandbox import (
    Failed,
    Finished,
    RuntimeMismatch,
    Sandbox,
    SandboxStopped,
    SnapshotCorrupt,
)
from lockgate.machine.sandbox import (
    Step as SandboxStep,
)
from lockgate.machine.settings import Settings
from lockgate.machine.tools.errors import ToolOutcomeUnknown
from lockgate.machine.tools.registry import make_idempotency_key
from lockgate.machine.values import limit_size, limit_text, to_json
from lockgate.machine.write_path import Carried, Step, WritePath
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C

log = logging.getLogger("lockgate.engine")

#: What a drive begins with: the first sandbox step (None: already paused) and its cursor.
FirstStep = Callable[[], tuple[SandboxStep | None, int]]


class Abandon(Protocol):
    """Recovery's verdict on one execution whose owner cannot go on with it (requeue it, or
    interrupt it naming the call in doubt, and `cause`, what the record says cut it off:
    a crash when None); `Recovery.recover_execution`."""

    def __call__(self, row: Execution, cause: str | None = None) -> object: ...


class Driver:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        sandbox: Sandbox,
        dispatcher: Dispatcher,
        settings: Settings,
        owner: str,
        handing_back: threading.Event,
        abandon: Abandon,
    ) -> None:
        self.store, self.write, self.sandbox = store, write, sandbox
        self.dispatcher, self.settings = dispatcher, settings
        #: The instance id written as the owner of the executions driven here.
        self.owner = owner
        #: Set when this instance drains: every execution it drives goes back to the queue
        #: at its next step (sandbox step or dispatch) instead of going on.
        self.handing_back = handing_back
        #: What becomes of an execution that fails here with a call in flight.
        self.abandon = abandon
        #: How many drives are under way here (the drain waits for them, within its bound).
        self._driving = 0
        self._driven = threading.Condition()

    def run(self, execution_id: str) -> bool:
        """Claim a pending execution and run it; False when another instance claimed it."""
        row = self.store.executions.get(execution_id)
        if row is None or row.status != E.PENDING or self.handing_back.is_set():
            return False  # (a draining instance would only hand it straight back)
        ex = record_of(row)
        try:
            self.write.apply(Step(ex, "start", {"owner": self.owner}))
        except Conflict:
            return False
        self.drive(ex, lambda: self.first_step(ex))
        return True

    def run_pending(self, limit: int) -> int:
        """Claim and run pending executions (new, or requeued by recovery)."""
        ids = self.store.executions.pending_ids(limit)
        return sum(1 for execution_id in ids if self.run(execution_id))

    def first_step(self, ex: ExecutionRecord) -> tuple[SandboxStep | None, int]:
        snapshot, at = ex.typed.snapshot, ex.typed.snapshot_call
        if snapshot is not None and at is not None:
            # Requeued after a crash: go on from the last checkpoint, replaying the journal.
            call = self.store.tool_calls.get(make_idempotency_key(ex.id, at))
            if call is None:
                raise RuntimeError(f"execution {ex.id}: checkpoint names a missing call {at}")
            return self.dispatcher.advance(ex, record_of(call), snapshot), at
        return self.dispatcher.start_sandbox(ex), 0

    def drive(
        self,
        ex: ExecutionRecord,
        first: FirstStep,
        *,
        new: bool = False,
        after: str = "recovery",
    ) -> None:
        """Drive the execution, failing it (not the server) on an unexpected error. `new`:
        it was stored by this drive's caller a moment ago, so its journal is empty. `after`:
        what it goes on after when not new (a `decision`, `answers` to its tool's questions,
        or `recovery` handing it to this instance), for its span."""
        with self._driven:
            self._driving += 1
        try:
            with tracing.span(
                "lockgate.execution" if new else "lockgate.resume",
                parent=ex.typed.trace_parent,
                attributes=tracing.attributes_of(
                    execution_id=ex.id, resumed_after=None if new else after
                ),
            ):
                self._drive_or_hand_back(ex, first, new=new)
        finally:
            with self._driven:
                self._driving -= 1
                self._driven.notify_all()

    def hand_back_all(self) -> int:
        """The drain: from now on every execution driven here goes back to `pending` at its
        next step, and the sandbox steps running now are stopped (their code since the last
        checkpoint runs again wherever the execution goes on; no call was in flight during
        a step). Returns how many running steps were cut off."""
        self.handing_back.set()
        return self.sandbox.stop()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no execution is driven here; False if some
        still is (a tool call in flight past the drain's bound: recovery's to judge)."""
        deadline = time.monotonic() + timeout
        with self._driven:
            while self._driving:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._driven.wait(left)
        return True

    def _hand_back(self, ex: ExecutionRecord, carried: Carried) -> None:
        """Back to the queue from the last checkpoint, released by this owner. Nothing the
        step did since the checkpoint is stored (its logs are produced again by the rerun),
        but the journal entries of calls made at once since then are (`carried`): the next
        owner answers them from the journal instead of making them again."""
        if ex.status != E.RUNNING:
            return
        latest = self.store.tool_calls.latest(ex.id)
        if latest is not None and latest.status == C.DISPATCHED:
            # Never by design (a dispatch is carried to its result first); were it so, the
            # call is in doubt and only recovery may judge it: leave the row as it is.
            log.warning("execution %s has a call in flight; left to recovery", ex.id)
            return
        try:
            self.write.apply(Step(ex, "hand_back"), carried=carried)
        except Conflict:
            log.warning("execution %s changed under us while handing it back", ex.id)
            return
        log.info("execution %s handed back: it goes on from its last checkpoint", ex.id)

    def _drive_or_hand_back(self, ex: ExecutionRecord, first: FirstStep, *, new: bool) -> None:
        # The journal entries of calls made at once, waiting for the next durable commit
        # (a hand back included). Dropped if the drive stops otherwise (a conflict, a
        # failure): the execution goes on from its last durable checkpoint and makes those
        # calls again.
        carried = Carried()
        try:
            # Read before the first step: calls above it were never journaled.
            journaled = 0 if new else self.store.tool_calls.journaled_through(ex.id)
            step, cursor = first()
            self._drive(ex, step, cursor, carried, journaled)
        except (HandBack, SandboxStopped):
            # The instance drains (its sandbox stopped under the step, or the next step was
            # not begun): not the execution's failure.
            self._hand_back(ex, carried)
        except Conflict:
            # Someone else moved it (recovery declared us dead, or it was cancelled): the
            # stored state is the truth and it is theirs now.
            log.warning("execution %s changed under us; leaving it", ex.id)
        except ToolOutcomeUnknown as exc:
            # A call that must not be repeated was sent and its answer lost: not a failure
            # of the server, but the same unknown as a crash after its dispatch.
            log.warning("execution %s: a call's outcome is unknown: %s", ex.id, exc.message)
            self._leave_in_doubt(ex, exc.message)
        except Exception as exc:  # the last line of defence: one execution, not the server
            log.exception("execution %s failed unexpectedly", ex.id)
            self._fail_internally(ex, exc)

    def _leave_in_doubt(self, ex: ExecutionRecord, cause: str) -> None:
        """Recovery's verdict, by recovery's own steps, on an execution whose dispatched
        call's outcome is unknown: the call in doubt and the execution interrupted naming
        it, `cause` on its record (or requeued, were the call one that may be retried)."""
        current = self.store.executions.get(ex.id)
        if current is None or current.status != E.RUNNING or current.owner != self.owner:
            return
        with contextlib.suppress(Conflict, GuardRefused):
            self.abandon(current, cause)

    def _fail_internally(self, ex: ExecutionRecord, exc: Exception) -> None:
        """End an execution this instance cannot go on with, the way the spec ends it: an
        unsent call is withdrawn with it, one in flight gets recovery's verdict (the
        composition lets an execution fail only once its call is settled). A refusal by the
        spec with a call in flight is the one case left failing as it is (see below)."""
        current = self.store.executions.get(ex.id)
        if current is None or current.status != E.RUNNING or current.owner != self.owner:
            return
        latest = self.store.tool_calls.latest(ex.id)
        refused_by_spec = isinstance(exc, GuardRefused | IllegalTransition)
        if latest is not None and latest.status == C.DISPATCHED and not refused_by_spec:
            # A call is in flight and its outcome was not recorded (the failure came between
            # its dispatch and its result): whether its effect happened is unknown, exactly
            # as if this instance had died here, so recovery's verdict applies: go on from
            # the checkpoint when calling it again is safe, or end interrupted, naming it.
            # Not for a refusal by the spec: that is a bug (here or in recovery, which put
            # the call where it cannot go on), and recovery's verdict could requeue the same
            # refusal forever; the execution fails, and what it leaves shows the bug.
            with contextlib.suppress(Conflict, GuardRefused):
                self.abandon(current)
            return
        error: JsonValue
        if isinstance(exc, RuntimeMismatch | SnapshotCorrupt):
            error = {"code": str(exc.code), "message": exc.message}
        else:
            error = {
                "code": "internal_error",
                "message": "The server failed while running "
                "this execution; it was stopped. Run the code again.",
            }
        steps = []
        if latest is not None and latest.status in (C.REQUESTED, C.APPROVED):
            # Never sent, and now never will be.
            ended = {"execution_ended": True}
            steps.append(Step(record_of(latest), "withdraw_on_crash", ended))
        steps.append(Step(record_of(current), "fail", {"outcome": {"error": error}}))
        with contextlib.suppress(Conflict, GuardRefused):
            self.write.apply(*steps)

    def _logs(self, ex: ExecutionRecord, new: str) -> str:
        joined = (ex.typed.logs or "") + new
        return limit_text(joined, self.settings.max_log_chars)

    def _drive(
        self,
        ex: ExecutionRecord,
        step: SandboxStep | None,
        cursor: int,
        carried: Carried,
        journaled: int,
    ) -> None:
        while step is not None:
            logs = self._logs(ex, step.logs)
            ended = {"logs": logs, "calls_made": ex.typed.calls_made}
            if isinstance(step, Finished):
                result = limit_size(to_json(step.output), self.settings.max_result_bytes)
                self.write.apply(
                    Step(ex, "complete", {"outcome": {"result": result}}, data=ended),
                    carried=carried,
                )
                return
            if isinstance(step, Failed):
                error = {"code": str(step.reason), "message": step.message}
                self.write.apply(
                    Step(ex, "fail", {"outcome": {"error": error}}, data=ended), carried=carried
                )
                return
            ex.typed.logs = logs  # carried into the next checkpoint's commit
            cursor += 1
            step = self.dispatcher.call(ex, step, cursor, carried, journaled)
