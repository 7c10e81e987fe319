"""The durable engine: agent code in the sandbox, tool calls through the journal.

Every status change goes through the write path. The engine's own state is the database:
a paused execution is its row (sealed snapshot, the call it waits on, its deadline) and that
call's journal row, written in one transaction; any process can pick either up.

A call's life in `_advance_call` follows the tool-call lifecycle:
requested -> (policy) blocked | approved | awaiting_approval (the execution pauses);
approved -> dispatched (intent, committed BEFORE the tool runs) -> succeeded | failed (result,
committed after). Whatever the call's stored status, `_advance_call` continues from it, which
is how a requeued execution replays its journal instead of calling tools twice.

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
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import JsonValue

from machine.db.schema import Execution, ToolCall
from machine.db.store import SqlStore, StoreWrite
from machine.errors import Conflict, GuardRefused, IllegalTransition
from machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    ExecutionNotFound,
    InvalidExecutionInput,
)
from machine.policy import Policy, PolicyDecision
from machine.records import Record
from machine.sandbox import (
    MONTY_VERSION,
    Failed,
    Finished,
    Raised,
    Returned,
    RuntimeMismatch,
    Sandbox,
    SandboxStopped,
    SnapshotCorrupt,
    Suspended,
    ToolOutcome,
    ToolRequest,
    sealed_version,
)
from machine.sandbox import (
    Step as SandboxStep,
)
from machine.secrets import MissingSecret, Redactor, SecretStore
from machine.settings import Settings
from machine.tools.registry import (
    InvalidArguments,
    Tool,
    ToolContext,
    ToolFailed,
    ToolRegistry,
    UnknownTool,
)
from machine.values import limit_size, limit_text, to_json
from machine.views import ExecutionView, build_view
from machine.write_path import Step, WritePath
from spec import ExecutionStatus as E
from spec import ToolCallStatus as C

log = logging.getLogger("lockgate.engine")


class Action(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def record_of(row: Execution | ToolCall) -> Record:
    machine = "execution" if isinstance(row, Execution) else "tool_call"
    return Record(machine, row.id, row.status, row.version, row.model_dump())


def _principal(ex: Record) -> str:
    """The principal an execution runs for: its sandbox steps are shared out by it."""
    return str(ex.fields["principal_id"])


@dataclass(frozen=True)
class _Dispatched:
    """What a tool call produced: a value for the code, or an error message for it."""

    value: JsonValue = None
    error: str | None = None


#: The exception type agent code sees for a call that did not happen (catchable as
#: `PermissionError` or `Exception`).
REFUSED = "PermissionError"


class _HandBack(Exception):
    """Raised inside a drive, at a step boundary, once this engine hands its work back."""


class Engine:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        sandbox: Sandbox,
        registry: ToolRegistry,
        policy: Policy,
        secrets: SecretStore,
        settings: Settings,
        owner: str,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.store = store
        self.sandbox = sandbox
        self.registry = registry
        self.policy = policy
        self.secrets = secrets
        self.settings = settings
        #: The instance id written as the owner of the executions this engine runs.
        self.owner = owner
        self.clock = clock
        #: The one write path, shared with the instance lease, sessions and recovery.
        self.write = write
        #: Set when this instance drains: every execution it drives goes back to the queue
        #: at its next step (sandbox step or dispatch) instead of going on.
        self.handing_back = threading.Event()
        #: How many drives are under way here (the drain waits for them, within its bound).
        self._driving = 0
        self._driven = threading.Condition()

    # -- reading -----------------------------------------------------------------------------

    def _execution(self, execution_id: str) -> Execution | None:
        return self.store.executions.get(execution_id)

    def _call_row(self, call_id: str) -> ToolCall | None:
        return self.store.tool_calls.get(call_id)

    def view(self, execution_id: str) -> ExecutionView:
        found = self.store.executions.with_calls(execution_id)
        if found is None:
            raise ExecutionNotFound(execution_id=execution_id)
        return build_view(*found)

    def _owned(self, execution_id: str, principal_id: str) -> Execution:
        row = self._execution(execution_id)
        if row is None or row.principal_id != principal_id:
            # Another principal's execution is answered exactly like a missing one: the
            # answer must not tell whether someone else's execution exists.
            raise ExecutionNotFound(execution_id=execution_id)
        return row

    def get(self, execution_id: str, principal_id: str) -> ExecutionView:
        """The execution as its principal sees it now (expiring it first when overdue)."""
        row = self._owned(execution_id, principal_id)
        self._expire_if_due(row)
        return self.view(execution_id)

    # -- starting ----------------------------------------------------------------------------

    def _new_execution(
        self,
        principal_id: str,
        code: str,
        session_id: str | None,
        origin_request: str | None = None,
    ) -> Execution:
        if not code.strip():
            raise InvalidExecutionInput("The code is empty: send the Python code to run.")
        if len(code) > self.settings.max_code_chars:
            raise InvalidExecutionInput(
                f"The code is {len(code)} characters long; the limit is "
                f"{self.settings.max_code_chars}. Send a shorter program."
            )
        now = self.clock()
        return Execution(
            id=uuid.uuid4().hex,
            principal_id=principal_id,
            session_id=session_id,
            origin_request=origin_request,
            status=E.PENDING.value,
            code=code,
            created_at=now,
            updated_at=now,
        )

    def submit(self, principal_id: str, code: str, session_id: str | None = None) -> str:
        """Store a new pending execution for any instance to claim; returns its id."""
        row = self._new_execution(principal_id, code, session_id)
        self.write.create("execution", row)
        return row.id

    def begin(
        self,
        principal_id: str,
        code: str,
        session_id: str | None = None,
        origin_request: str | None = None,
    ) -> Record:
        """Store a new execution claimed by this instance in the same transaction (no other
        instance can take it in between). `carry_on` runs it. `origin_request` names the
        request that started it, so a lost answer can say what became of it."""
        row = self._new_execution(principal_id, code, session_id, origin_request)
        ex = record_of(row)
        self.write.apply(Step(ex, "start", {"owner": self.owner}), inserts=[row])
        return ex

    def carry_on(self, ex: Record) -> ExecutionView:
        """Run a claimed execution until it finishes or pauses."""
        self._guarded(ex, lambda: self._first_step(ex))
        return self.view(ex.id)

    def execute(
        self,
        principal_id: str,
        code: str,
        session_id: str | None = None,
        origin_request: str | None = None,
    ) -> ExecutionView:
        """Store, claim and run a new execution until it finishes or pauses."""
        return self.carry_on(self.begin(principal_id, code, session_id, origin_request))

    def run(self, execution_id: str) -> bool:
        """Claim a pending execution and run it; False when another instance claimed it."""
        row = self._execution(execution_id)
        if row is None or row.status != E.PENDING or self.handing_back.is_set():
            return False  # (a draining instance would only hand it straight back)
        ex = record_of(row)
        try:
            self.write.apply(Step(ex, "start", {"owner": self.owner}))
        except Conflict:
            return False
        self._guarded(ex, lambda: self._first_step(ex))
        return True

    def run_pending(self, limit: int = 50) -> int:
        """Claim and run pending executions (new, or requeued by recovery)."""
        ids = self.store.executions.pending_ids(limit)
        return sum(1 for execution_id in ids if self.run(execution_id))

    def _first_step(self, ex: Record) -> tuple[SandboxStep | None, int]:
        snapshot = ex.fields.get("snapshot")
        at = ex.fields.get("snapshot_call")
        if isinstance(snapshot, bytes) and isinstance(at, int):
            # Requeued after a crash: go on from the last checkpoint, replaying the journal.
            call = self._call_row(f"{ex.id}:{at}")
            if call is None:
                raise RuntimeError(f"execution {ex.id}: checkpoint names a missing call {at}")
            return self._advance_call(ex, record_of(call), snapshot), at
        self._go_on()
        return self.sandbox.start(str(ex.fields["code"]), principal=_principal(ex)), 0

    # -- handing work back (the drain) ---------------------------------------------------------

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

    def _go_on(self) -> None:
        """Before work a drain must not wait for (a sandbox step, a dispatch): hand back."""
        if self.handing_back.is_set():
            raise _HandBack()

    def _hand_back(self, ex: Record) -> None:
        """Back to the queue from the last checkpoint, released by this owner. Nothing the
        step did since the checkpoint is stored (its logs are produced again by the rerun)."""
        if ex.status != E.RUNNING:
            return
        latest = self.store.tool_calls.latest(ex.id)
        if latest is not None and latest.status == C.DISPATCHED:
            # Never by design (a dispatch is carried to its result first); were it so, the
            # call is in doubt and only recovery may judge it: leave the row as it is.
            log.warning("execution %s has a call in flight; left to recovery", ex.id)
            return
        try:
            self.write.apply(Step(ex, "hand_back"))
        except Conflict:
            log.warning("execution %s changed under us while handing it back", ex.id)
            return
        log.info("execution %s handed back: it goes on from its last checkpoint", ex.id)

    # -- the drive loop ----------------------------------------------------------------------

    def _guarded(self, ex: Record, first: Callable[[], tuple[SandboxStep | None, int]]) -> None:
        """Drive the execution, failing it (not the server) on an unexpected error."""
        with self._driven:
            self._driving += 1
        try:
            self._drive_or_hand_back(ex, first)
        finally:
            with self._driven:
                self._driving -= 1
                self._driven.notify_all()

    def _drive_or_hand_back(
        self, ex: Record, first: Callable[[], tuple[SandboxStep | None, int]]
    ) -> None:
        try:
            step, cursor = first()
            self._drive(ex, step, cursor)
        except (_HandBack, SandboxStopped):
            # The instance drains (its sandbox stopped under the step, or the next step was
            # not begun): not the execution's failure.
            self._hand_back(ex)
        except Conflict:
            # Someone else moved it (recovery declared us dead, or it was cancelled): the
            # stored state is the truth and it is theirs now.
            log.warning("execution %s changed under us; leaving it", ex.id)
        except Exception as exc:  # the last line of defence: one execution, not the server
            log.exception("execution %s failed unexpectedly", ex.id)
            self._fail_internally(ex, exc)

    def _fail_internally(self, ex: Record, exc: Exception) -> None:
        current = self._execution(ex.id)
        if current is None or current.status != E.RUNNING or current.owner != self.owner:
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
        record = record_of(current)
        with contextlib.suppress(Conflict, GuardRefused):
            self.write.apply(Step(record, "fail", {"outcome": {"error": error}}))

    def _logs(self, ex: Record, new: str) -> str:
        joined = str(ex.fields.get("logs") or "") + new
        return limit_text(joined, self.settings.max_log_chars)

    def _drive(self, ex: Record, step: SandboxStep | None, cursor: int) -> None:
        while step is not None:
            logs = self._logs(ex, step.logs)
            if isinstance(step, Finished):
                result = limit_size(to_json(step.output), self.settings.max_result_bytes)
                self.write.apply(
                    Step(ex, "complete", {"outcome": {"result": result}}, data={"logs": logs})
                )
                return
            if isinstance(step, Failed):
                error = {"code": str(step.reason), "message": step.message}
                self.write.apply(
                    Step(ex, "fail", {"outcome": {"error": error}}, data={"logs": logs})
                )
                return
            ex.fields["logs"] = logs
            cursor += 1
            step = self._call(ex, step, cursor)

    def _call(self, ex: Record, suspended: Suspended, seq: int) -> SandboxStep | None:
        request = suspended.request
        call_id = f"{ex.id}:{seq}"
        try:
            tool = self.registry.get(request.name)
            arguments = self.registry.validate_arguments(
                request.name, dict(request.kwargs), list(request.args)
            )
        except (UnknownTool, InvalidArguments) as exc:
            # Nothing was requested that could run: the code sees the error, no journal row.
            return self._resume(ex, suspended.snapshot, Raised("TypeError", exc.message))
        existing = self._call_row(call_id)
        if existing is not None:
            if existing.tool != tool.spec.full_name:
                return self._resume(
                    ex,
                    suspended.snapshot,
                    Raised(
                        "RuntimeError",
                        f"replaying after a restart, call {seq} asked for "
                        f"{tool.spec.call_name} but the journal recorded "
                        f"tools.{existing.tool}: the code is not deterministic",
                    ),
                )
            return self._advance_call(ex, record_of(existing), suspended.snapshot)
        now = self.clock()
        row = ToolCall(
            id=call_id,
            execution_id=ex.id,
            seq=seq,
            tool=tool.spec.full_name,
            status=C.REQUESTED.value,
            idempotent=tool.spec.idempotent,
            arguments=arguments,
            arguments_preview=limit_size(arguments, 4096),
            created_at=now,
            updated_at=now,
        )
        checkpoint = self.settings.checkpoint_every_call
        self.write.apply(
            Step(
                ex,
                "checkpoint",
                {"snapshot": suspended.snapshot if checkpoint else ex.fields.get("snapshot")},
                data={
                    "calls_made": seq,
                    "logs": ex.fields.get("logs", ""),
                    **(
                        {"snapshot_call": seq, "runtime_version": MONTY_VERSION}
                        if checkpoint
                        else {}
                    ),
                },
            ),
            inserts=[row],
        )
        return self._advance_call(ex, record_of(row), suspended.snapshot)

    def _advance_call(self, ex: Record, call: Record, snapshot: bytes) -> SandboxStep | None:
        """Carry one journal row forward from whatever status it is in; returns the next
        sandbox step, or None when the execution paused."""
        tool_name = str(call.fields["tool"])
        while True:
            status = call.status
            if status == C.REQUESTED:
                tool = self.registry.get(tool_name)
                decision = self.policy.decide(tool.spec)
                if decision is PolicyDecision.BLOCK:
                    self.write.apply(Step(call, "block"), fence=ex)
                elif decision is PolicyDecision.APPROVE:
                    self.write.apply(Step(call, "auto_approve"), fence=ex)
                else:
                    self._pause(ex, call, snapshot)
                    return None
            elif status in (C.APPROVED, C.DISPATCHED):
                if status == C.APPROVED:
                    self._go_on()  # not sent yet: the next owner sends it
                # A dispatched call (a requeued execution's idempotent one) is already out:
                # it is carried to its result, even while draining.
                outcome = self._dispatch(ex, call)
                return self._resume(ex, snapshot, outcome)
            else:
                return self._resume(ex, snapshot, self._settled_outcome(call))

    def _resume(self, ex: Record, snapshot: bytes, outcome: ToolOutcome) -> SandboxStep:
        self._go_on()
        return self.sandbox.resume(snapshot, outcome, principal=_principal(ex))

    def _settled_outcome(self, call: Record) -> ToolOutcome:
        tool = f"tools.{call.fields['tool']}"
        status = call.status
        result = call.fields.get("result")
        if status == C.SUCCEEDED and isinstance(result, dict):
            return Returned(result.get("value"))
        if status == C.FAILED and isinstance(result, dict):
            return Raised("RuntimeError", f"{tool} failed: {result.get('error')}")
        if status == C.BLOCKED:
            return Raised(REFUSED, f"{tool} is blocked by the server's policy")
        if status == C.DECLINED:
            decision = call.fields.get("decision")
            action = decision.get("action") if isinstance(decision, dict) else "decline"
            verb = "cancelled" if action == Action.CANCEL else "declined"
            return Raised(REFUSED, f"the call to {tool} was {verb} by the approver")
        raise RuntimeError(f"call {call.id} cannot be resumed from {status!r}")

    def _pause(self, ex: Record, call: Record, snapshot: bytes) -> None:
        deadline = self.clock() + self.settings.approval_ttl
        self.write.apply(
            Step(call, "request_approval", {"arguments_preview": call.fields["arguments_preview"]}),
            Step(
                ex,
                "pause",
                {"snapshot": snapshot, "deadline": deadline},
                data={
                    "snapshot_call": int(str(call.fields["seq"])),
                    "runtime_version": MONTY_VERSION,
                    "logs": ex.fields.get("logs", ""),
                },
            ),
        )

    def _dispatch(self, ex: Record, call: Record) -> ToolOutcome:
        tool = self.registry.get(str(call.fields["tool"]))
        arguments = call.fields.get("arguments")
        event = "dispatch" if call.status == C.APPROVED else "redispatch"
        attempts = int(str(call.fields.get("attempts") or 0)) + 1
        applied = self.write.apply(
            Step(call, event, data={"attempts": attempts}),
            effect=lambda: self._invoke(
                tool, arguments if isinstance(arguments, dict) else {}, call.id, ex
            ),
            fence=ex,  # only while this instance still holds the execution
        )
        done = applied.effect_result
        assert done is not None
        if done.error is None:
            self.write.apply(Step(call, "succeed", {"result": {"value": done.value}}), fence=ex)
            return Returned(done.value)
        self.write.apply(Step(call, "fail", {"result": {"error": done.error}}), fence=ex)
        return Raised("RuntimeError", f"tools.{tool.spec.full_name} failed: {done.error}")

    def _invoke(
        self, tool: Tool, arguments: dict[str, JsonValue], call_id: str, ex: Record
    ) -> _Dispatched:
        """Run the tool with its secrets resolved now; nothing it returns or raises is kept
        before every secret value is scrubbed from it."""
        try:
            secrets = self.secrets.resolve(tool.spec.secrets)
        except MissingSecret as exc:
            return _Dispatched(error=exc.message)
        redactor = Redactor(secrets.values())
        context = ToolContext(
            idempotency_key=call_id,
            secrets=secrets,
            principal_id=str(ex.fields["principal_id"]),
        )
        try:
            value = tool.call(arguments, context)
        except ToolFailed as exc:
            return _Dispatched(error=redactor.redact_text(str(exc)))
        except Exception as exc:
            log.warning(
                "tool %s raised %s", tool.spec.full_name, type(exc).__name__
            )  # the message may hold a secret: the type is enough for operators
            return _Dispatched(error=f"the tool failed unexpectedly ({type(exc).__name__})")
        clean = redactor.redact(to_json(value))
        return _Dispatched(value=limit_size(clean, self.settings.max_result_bytes))

    # -- decisions ---------------------------------------------------------------------------

    def resume(
        self,
        execution_id: str,
        principal_id: str,
        action: Action,
        content: JsonValue = None,
        *,
        expected_call: int | None = None,
        writes: Sequence[StoreWrite] = (),
    ) -> ExecutionView:
        """Apply a person's decision to a paused execution and run it on.

        Repeating the decision that settled it returns the same outcome; any other attempt
        on an execution that is no longer waiting is `already_settled`. With
        `expected_call`, the decision applies only to that call (an approval link decides
        the call it was made for, never a later one): the check and the decision are one
        transaction, since the decision is conditional on the row's version. `writes`
        commit in the decision's transaction (an approval link used up by it); with them, a
        repeat is `already_settled` too, since they were not made."""
        row = self._owned(execution_id, principal_id)
        row = self._expire_if_due(row)
        if (
            expected_call is not None
            and row.status == E.WAITING_FOR_INTERACTION
            and row.snapshot_call != expected_call
        ):
            raise ExecutionAlreadySettled(
                execution_id=row.id,
                status=row.status,
                detail="the decision was for an earlier tool call",
            )
        if row.status == E.WAITING_FOR_INTERACTION:
            snapshot = row.snapshot
            if snapshot is None or row.snapshot_call is None:
                raise RuntimeError(f"paused execution {execution_id} has no snapshot")
            # Refuse a snapshot this runtime cannot load BEFORE the decision is consumed.
            made_by = sealed_version(snapshot)
            if made_by != MONTY_VERSION:
                raise RuntimeMismatch(sealed_version=made_by)
            call_row = self._call_row(f"{execution_id}:{row.snapshot_call}")
            if call_row is None:
                raise RuntimeError(f"paused execution {execution_id} has no pending call")
            ex, call = record_of(row), record_of(call_row)
            decision: JsonValue = {"action": str(action), "content": content}
            try:
                self.write.apply(
                    Step(
                        call,
                        "approve" if action is Action.ACCEPT else "decline",
                        {"decision": decision, "deadline": row.deadline},
                    ),
                    Step(ex, "resume", {"owner": self.owner}),
                    writes=writes,
                )
            except (Conflict, GuardRefused, IllegalTransition):
                # Lost the race (our read was stale by the time we wrote): see who won.
                row = self._owned(execution_id, principal_id)
            else:
                self._guarded(ex, lambda: (self._advance_call(ex, call, snapshot), call_row.seq))
                return self.view(execution_id)
        return self._settled(row, action, repeat=not writes)

    def _settled(self, row: Execution, action: Action, *, repeat: bool = True) -> ExecutionView:
        if row.status == E.EXPIRED:
            raise ExecutionExpired(
                execution_id=row.id, deadline=row.deadline.isoformat() if row.deadline else None
            )
        if row.status == E.INTERRUPTED:
            raise ExecutionInterrupted(execution_id=row.id, what_ran=row.what_ran)
        call = self.store.tool_calls.last_decided(row.id)
        decision = call.decision if call is not None else None
        decided = decision.get("action") if isinstance(decision, dict) else None
        terminal = row.status not in (E.PENDING, E.RUNNING, E.WAITING_FOR_INTERACTION)
        if decided == action and terminal and repeat:
            return self.view(row.id)  # the same decision again: the same settled outcome
        detail = f"a decision was already recorded ({decided})" if decided else "it is not paused"
        raise ExecutionAlreadySettled(execution_id=row.id, status=row.status, detail=detail)

    # -- expiry ------------------------------------------------------------------------------

    def _expire_if_due(self, row: Execution) -> Execution:
        if (
            row.status != E.WAITING_FOR_INTERACTION
            or row.deadline is None
            or self.clock() < row.deadline
        ):
            return row
        call_row = self._call_row(f"{row.id}:{row.snapshot_call}")
        steps = [Step(record_of(row), "expire")]
        if call_row is not None and call_row.status == C.AWAITING_APPROVAL:
            steps.insert(0, Step(record_of(call_row), "expire", {"deadline": row.deadline}))
        # A conflict or a stale read means someone else expired or resumed it first.
        with contextlib.suppress(Conflict, GuardRefused, IllegalTransition):
            self.write.apply(*steps)
        fresh = self._execution(row.id)
        assert fresh is not None
        return fresh

    def expire_due(self) -> int:
        """The periodic sweep: expire every paused execution past its deadline."""
        rows = self.store.executions.paused_due(self.clock())
        return sum(1 for row in rows if self._expire_if_due(row).status == E.EXPIRED)

    # -- cancellation ------------------------------------------------------------------------

    def cancel(self, execution_id: str, principal_id: str) -> ExecutionView:
        """Cancel a pending or paused execution (its unsent call is withdrawn)."""
        row = self._expire_if_due(self._owned(execution_id, principal_id))
        if row.status == E.EXPIRED:
            raise ExecutionExpired(
                execution_id=row.id, deadline=row.deadline.isoformat() if row.deadline else None
            )
        if row.status not in (E.PENDING, E.WAITING_FOR_INTERACTION):
            raise ExecutionAlreadySettled(
                execution_id=row.id,
                status=row.status,
                detail="only a pending or paused execution can be cancelled",
            )
        steps = [Step(record_of(row), "cancel")]
        if row.snapshot_call is not None and row.status == E.WAITING_FOR_INTERACTION:
            call_row = self._call_row(f"{row.id}:{row.snapshot_call}")
            if call_row is not None and call_row.status == C.AWAITING_APPROVAL:
                steps.insert(0, Step(record_of(call_row), "withdraw"))
        try:
            self.write.apply(*steps)
        except (Conflict, GuardRefused, IllegalTransition):
            return self._settled(self._owned(execution_id, principal_id), Action.CANCEL)
        return self.view(execution_id)

    # -- counts for the session lease --------------------------------------------------------

    def live_counts(
        self, *, session_id: str | None = None, principal_id: str | None = None
    ) -> dict[str, int]:
        """Running (pending included) and paused executions, for the lease policy."""
        statuses = self.store.executions.live_statuses(
            session_id=session_id, principal_id=principal_id
        )
        paused = sum(1 for st in statuses if st == E.WAITING_FOR_INTERACTION)
        return {"running": len(statuses) - paused, "paused": paused}

    def paused_count(self, principal_id: str) -> int:
        """The principal's executions waiting for a decision, on every instance (for the
        `max_paused_per_principal` admission limit)."""
        return self.store.executions.paused_count(principal_id)


__all__ = ["Action", "Engine", "ExecutionView", "ToolRequest"]
