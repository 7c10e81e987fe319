"""The durable engine: agent code in the sandbox, tool calls through the journal.

Every status change goes through the write path. The engine's own state is the database:
a paused execution is its row (sealed snapshot, the call it waits on, its deadline) and that
call's journal row, written in one transaction; any process can pick either up.

`Engine` is the facade the server, the simulator and the tests call. It starts executions and
applies people's decisions (resume, cancel, expiry) itself, and leaves the rest to:

- `machine.driver.Driver`: claims executions and runs their sandbox steps (and the drain's
  hand-back);
- `machine.dispatcher.Dispatcher`: one tool call's way through the journal (policy, approval
  request, dispatch, settled outcome);
- `machine.execution_reads.ExecutionReads`: views and counts, reads only.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine import tracing
from lockgate.machine.approval_audit import Decider, decision_record, decision_span
from lockgate.machine.approval_grants import grant_of
from lockgate.machine.call_answers import CallAnswers, NotApproval
from lockgate.machine.db.errors import ConstraintViolation
from lockgate.machine.db.execution_queries import LiveUnder
from lockgate.machine.db.queries import new_row
from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore
from lockgate.machine.dispatcher import Action, Dispatcher, ExecutionRecord, record_of
from lockgate.machine.driver import Abandon, Driver
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    InvalidExecutionInput,
    LimitReached,
    code_too_long,
)
from lockgate.machine.execution_reads import ExecutionReads
from lockgate.machine.policy import Policy
from lockgate.machine.policy_book import PolicyBook, as_book
from lockgate.machine.sandbox import (
    MONTY_VERSION,
    RuntimeMismatch,
    Sandbox,
    ToolRequest,
    sealed_version,
)
from lockgate.machine.secrets import SecretStore
from lockgate.machine.settings import Settings
from lockgate.machine.source_book import SourceBook
from lockgate.machine.storage import within_budget
from lockgate.machine.tools.registry import ToolRegistry, make_idempotency_key
from lockgate.machine.views import ExecutionView
from lockgate.machine.webhooks import WebhookOutbox
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import EXECUTION
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C


class Engine:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        sandbox: Sandbox,
        registry: ToolRegistry | SourceBook,
        policy: Policy | PolicyBook,
        secrets: SecretStore,
        settings: Settings,
        owner: str,
        abandon: Abandon,
        clock: Callable[[], datetime],
    ) -> None:
        self.store = store
        #: The one write path, shared with the instance lease, sessions and recovery.
        self.write = write
        #: Every principal's effective policy (a plain `Policy` is the same for all).
        self.policy = as_book(policy)
        self.settings = settings
        #: The instance id written as the owner of the executions this engine runs.
        self.owner = owner
        self.clock = clock
        #: Set when this instance drains (shared by the driver and the dispatcher).
        self.handing_back = threading.Event()
        self.reads = ExecutionReads(store)
        #: Events about approvals owed to the operator's endpoint (the pause queues them).
        self.webhooks = WebhookOutbox(
            store=store, write=write, settings=settings, clock=lambda: self.clock(), owner=owner
        )
        self.dispatcher = Dispatcher(
            store=store,
            write=write,
            sandbox=sandbox,
            registry=registry,
            policy=self.policy,
            secrets=secrets,
            settings=settings,
            # Read through the facade, so a clock swapped on the engine (tests, the
            # simulator) is the one the journal's timestamps and deadlines use.
            clock=lambda: self.clock(),
            handing_back=self.handing_back,
            webhooks=self.webhooks,
        )
        self.driver = Driver(
            store=store,
            write=write,
            sandbox=sandbox,
            dispatcher=self.dispatcher,
            settings=settings,
            owner=owner,
            handing_back=self.handing_back,
            abandon=abandon,
        )
        #: Answers to what a tool asked its user (`ToolContext.ask`), for its paused call.
        self.answers = CallAnswers(
            store=store,
            write=write,
            reads=self.reads,
            driver=self.driver,
            dispatcher=self.dispatcher,
            owner=owner,
            expire_if_due=self._expire_if_due,
        )

    def get(self, execution_id: str, principal_id: str) -> ExecutionView:
        """The execution as its principal sees it now (expiring it first when overdue)."""
        row = self.reads.owned(execution_id, principal_id)
        self._expire_if_due(row)
        return self.view(execution_id)

    def view(self, execution_id: str) -> ExecutionView:
        return self.reads.view(execution_id)

    def live_counts(
        self, *, session_id: str | None = None, principal_id: str | None = None
    ) -> dict[str, int]:
        """Running (pending included) and paused executions, for the lease policy."""
        return self.reads.live_counts(session_id=session_id, principal_id=principal_id)

    def paused_count(self, principal_id: str) -> int:
        """The principal's paused executions (the `max_paused_per_principal` limit)."""
        return self.reads.paused_count(principal_id)

    def _new_execution(
        self,
        principal_id: str,
        code: str,
        session_id: str | None,
        origin_request: str | None = None,
        idempotency_key: str | None = None,
        direct_tool: str | None = None,
    ) -> Execution:
        if not code.strip():
            raise InvalidExecutionInput("The code is empty: send the Python code to run.")
        if len(code) > self.settings.max_code_chars:
            raise InvalidExecutionInput(code_too_long(len(code), self.settings.max_code_chars))
        now = self.clock()
        return new_row(
            Execution,
            id=uuid.uuid4().hex,
            principal_id=principal_id,
            session_id=session_id,
            origin_request=origin_request,
            idempotency_key=idempotency_key,
            status=E.PENDING.value,
            code=code,
            direct_tool=direct_tool,
            # Its later spans (decision, resume) continue the trace of what started it.
            trace_parent=tracing.current_parent(),
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
        idempotency_key: str | None = None,
        admit: Callable[[], None] = lambda: None,
        live_limit: int | None = None,
        direct_tool: str | None = None,
    ) -> ExecutionRecord:
        """Store a new execution claimed by this instance in the same transaction (no other
        instance can take it in between). `carry_on` runs it. `origin_request` names the
        request that started it, so a lost answer can say what became of it.

        With `idempotency_key`, an execution the principal already started with that key
        is not started again: `AlreadyStarted` names it (the caller waits for it), or
        `IdempotencyKeyReused` when it runs other code. Two racing calls with one key
        cannot both start one: the store's unique index refuses the second insert.
        `admit` (the caller's admission limits) runs after the key check: a repeat starts
        nothing, so no limit refuses it. `live_limit`: the most unfinished executions the
        principal may have, counted in the insert's own transaction (exact under any
        concurrency); `LimitReached` beyond it. `direct_tool`: the direct tool whose call
        this is (its answer is that tool's, not `execute`'s)."""
        if idempotency_key is not None:
            self.reads.refuse_started(principal_id, code, idempotency_key)
        admit()
        row = self._new_execution(
            principal_id, code, session_id, origin_request, idempotency_key, direct_tool
        )
        ex = record_of(row)
        under = [
            *(
                [LiveUnder(principal_id, live_limit, lambda: LimitReached.paused(live_limit))]
                if live_limit is not None
                else []
            ),
            # The bytes its executions keep, within the principal's budget.
            within_budget(principal_id, self.settings.max_stored_bytes_per_principal),
        ]
        try:
            self.write.apply(Step(ex, "start", {"owner": self.owner}), inserts=[row], writes=under)
        except ConstraintViolation:
            if idempotency_key is None:
                raise
            self.reads.refuse_started(principal_id, code, idempotency_key)
            raise
        return ex

    def carry_on(self, ex: ExecutionRecord) -> ExecutionView:
        """Run an execution `begin` has just stored and claimed, until it finishes or
        pauses (its journal is empty: nothing to look up before its calls)."""
        self.driver.drive(ex, lambda: self.driver.first_step(ex), new=True)
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
        return self.driver.run(execution_id)

    def run_pending(self, limit: int = 50) -> int:
        """Claim and run pending executions (new, or requeued by recovery)."""
        return self.driver.run_pending(limit)

    def hand_back_all(self) -> int:
        """The drain (`Driver.hand_back_all`): returns how many running steps were cut off."""
        return self.driver.hand_back_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no execution is driven here."""
        return self.driver.wait_idle(timeout)

    def resume(
        self,
        execution_id: str,
        principal_id: str,
        action: Action,
        content: JsonValue = None,
        *,
        expected_call: int | None = None,
        decided_by: Decider | None = None,
    ) -> ExecutionView:
        """Apply a person's decision to a paused execution and run it on. The decision is
        stored with its audit record (`decided_by`: the door and who; by default the
        server's own), in the decision's transaction.

        Repeating the decision that settled it returns the same outcome; any other attempt
        on an execution that is no longer waiting is `already_settled`. With
        `expected_call`, the decision applies only to that call (a person decides the call
        they were shown, never a later one): the check and the decision are one
        transaction, since the decision is conditional on the row's version."""
        row = self.reads.owned(execution_id, principal_id)
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
            if action is Action.ACCEPT:  # a grant that cannot be read is refused, unspent
                grant_of(content, self.settings.max_calls)
            snapshot = row.snapshot
            if snapshot is None or row.snapshot_call is None:
                raise RuntimeError(f"paused execution {execution_id} has no snapshot")
            # Refuse a snapshot this runtime cannot load BEFORE the decision is consumed.
            made_by = sealed_version(snapshot)
            if made_by != MONTY_VERSION:
                raise RuntimeMismatch(sealed_version=made_by)
            call_row = self.store.tool_calls.get(
                make_idempotency_key(execution_id, row.snapshot_call)
            )
            if call_row is None:
                raise RuntimeError(f"paused execution {execution_id} has no pending call")
            if call_row.status == C.AWAITING_INPUT and action is not Action.CANCEL:
                raise NotApproval(
                    f"Execution {execution_id!r} waits for answers to what tools."
                    f"{call_row.tool} asked its user, not for a decision.",
                    hint="Answer its questions through the client that made the call (or "
                    "resume with answers), or cancel the execution.",
                )
            if call_row.status == C.AWAITING_INPUT:
                return self.cancel(execution_id, principal_id)
            ex, call = record_of(row), record_of(call_row)
            decider = decided_by or Decider.of_server()
            decision: JsonValue = decision_record(
                str(action),
                content,
                decider,
                arguments=call_row.arguments,
                policy=self.policy.for_principal(principal_id),
                decided_at=self.clock(),
                expires_at=row.deadline,
            )
            try:
                with decision_span(
                    row.trace_parent, row.id, call_row.seq, call_row.tool, str(action), decider
                ):
                    self.write.apply(
                        Step(
                            call,
                            "approve" if action is Action.ACCEPT else "decline",
                            {"decision": decision, "deadline": row.deadline},
                        ),
                        Step(ex, "resume", {"owner": self.owner}),
                    )
            except (Conflict, GuardRefused, IllegalTransition):
                # Lost the race (our read was stale by the time we wrote): see who won.
                row = self.reads.owned(execution_id, principal_id)
            else:
                self.driver.drive(
                    ex,
                    lambda: (self.dispatcher.advance(ex, call, snapshot), call_row.seq),
                    after="decision",
                )
                return self.view(execution_id)
        return self._settled(row, action, decided_by)

    def _settled(
        self, row: Execution, action: Action, decided_by: Decider | None = None
    ) -> ExecutionView:
        if row.status == E.EXPIRED:
            raise ExecutionExpired(
                execution_id=row.id, deadline=row.deadline.isoformat() if row.deadline else None
            )
        if row.status == E.INTERRUPTED:
            raise ExecutionInterrupted(execution_id=row.id, what_ran=row.what_ran)
        call = self.store.tool_calls.last_decided(row.id)
        decision = call.decision if call is not None else None
        decided = decision.get("action") if isinstance(decision, dict) else None
        terminal = row.status not in EXECUTION.live_names
        # The same decision again, by the same person (or again by nobody in particular: a
        # client retrying its resume): the same settled outcome. Another person's equal
        # decision did not decide anything, and is told so.
        person = decided_by.person.as_json() if decided_by and decided_by.person else None
        recorded = decision.get("person") if isinstance(decision, dict) else None
        if decided == action and terminal and _same_person(recorded, person):
            return self.view(row.id)
        detail = f"a decision was already recorded ({decided})" if decided else "it is not paused"
        raise ExecutionAlreadySettled(execution_id=row.id, status=row.status, detail=detail)

    def _expire_if_due(self, row: Execution) -> Execution:
        if (
            row.status != E.WAITING_FOR_INTERACTION
            or row.deadline is None
            or self.clock() < row.deadline
        ):
            return row
        call_row = (
            None
            if row.snapshot_call is None  # paused without a call: only the execution expires
            else self.store.tool_calls.get(make_idempotency_key(row.id, row.snapshot_call))
        )
        steps = [Step(record_of(row), "expire")]
        if call_row is not None and call_row.status in (C.AWAITING_APPROVAL, C.AWAITING_INPUT):
            steps.insert(0, Step(record_of(call_row), "expire", {"deadline": row.deadline}))
        # A conflict or a stale read means someone else expired or resumed it first.
        with contextlib.suppress(Conflict, GuardRefused, IllegalTransition):
            self.write.apply(*steps)
        fresh = self.store.executions.get(row.id)
        assert fresh is not None
        return fresh

    def expire_due(self) -> int:
        """The periodic sweep: expire every paused execution past its deadline."""
        rows = self.store.executions.paused_due(self.clock())
        return sum(1 for row in rows if self._expire_if_due(row).status == E.EXPIRED)

    def cancel(self, execution_id: str, principal_id: str) -> ExecutionView:
        """Cancel a pending or paused execution (its unsent call is withdrawn)."""
        row = self._expire_if_due(self.reads.owned(execution_id, principal_id))
        if row.status == E.EXPIRED:
            raise ExecutionExpired(
                execution_id=row.id, deadline=row.deadline.isoformat() if row.deadline else None
            )
        # Not `live_names`: a running execution is live but cannot be cancelled.
        if row.status not in (E.PENDING, E.WAITING_FOR_INTERACTION):
            raise ExecutionAlreadySettled(
                execution_id=row.id,
                status=row.status,
                detail="only a pending or paused execution can be cancelled",
            )
        steps = [Step(record_of(row), "cancel")]
        if row.snapshot_call is not None and row.status == E.WAITING_FOR_INTERACTION:
            call_row = self.store.tool_calls.get(make_idempotency_key(row.id, row.snapshot_call))
            if call_row is not None and call_row.status in (C.AWAITING_APPROVAL, C.AWAITING_INPUT):
                steps.insert(0, Step(record_of(call_row), "withdraw"))
        try:
            self.write.apply(*steps)
        except (Conflict, GuardRefused, IllegalTransition):
            return self._settled(self.reads.owned(execution_id, principal_id), Action.CANCEL)
        return self.view(execution_id)


def _same_person(recorded: object, asking: dict[str, JsonValue] | None) -> bool:
    """Whether the person a decision records is the one asking (by issuer and subject)."""
    if recorded is None or asking is None:
        return recorded is None and asking is None
    if not isinstance(recorded, dict):
        return False
    return (recorded.get("issuer"), recorded.get("subject")) == (
        asking.get("issuer"),
        asking.get("subject"),
    )


__all__ = ["Action", "Engine", "ExecutionView", "ToolRequest", "record_of"]
