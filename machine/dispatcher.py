"""The dispatcher: one tool call's way through the journal, from request to settled outcome.

A call's life in `advance` follows the tool-call lifecycle:
requested -> (policy) blocked | approved | awaiting_approval (the execution pauses);
approved -> dispatched (intent, committed BEFORE the tool runs) -> succeeded | failed (result,
committed after). Whatever the call's stored status, `advance` continues from it, which is
how a requeued execution replays its journal instead of calling tools twice.

It gives the sandbox its next step (`resume_sandbox`) only after `go_on`: once the instance
hands its work back (the drain), no new sandbox step or dispatch begins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine.approval_grants import covering

# Code imports these from here: the `X as X` form re-exports them (mypy --strict).
from lockgate.machine.call_outcomes import REFUSED as REFUSED
from lockgate.machine.call_outcomes import Action as Action
from lockgate.machine.call_outcomes import arguments_too_large, settled_outcome
from lockgate.machine.call_pauses import CallPauses, Opening
from lockgate.machine.db.queries import new_row
from lockgate.machine.db.schema import ToolCall
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import GuardRefused

# Code imports these from here: the `X as X` form re-exports them (mypy --strict).
from lockgate.machine.journal_records import CallRecord as CallRecord
from lockgate.machine.journal_records import ExecutionRecord as ExecutionRecord
from lockgate.machine.journal_records import principal_of as principal_of
from lockgate.machine.journal_records import record_of as record_of
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.policy_book import PolicyBook
from lockgate.machine.sandbox import (
    MONTY_VERSION,
    Raised,
    Returned,
    Sandbox,
    Suspended,
    ToolOutcome,
)
from lockgate.machine.sandbox import Step as SandboxStep
from lockgate.machine.secrets import SecretStore
from lockgate.machine.settings import Settings
from lockgate.machine.source_book import SourceBook, as_source_book
from lockgate.machine.storage import StorageBudget
from lockgate.machine.tool_invocation import Dispatched, invoke
from lockgate.machine.tools.call_notices import CallNotices
from lockgate.machine.tools.questions import stored_answers
from lockgate.machine.tools.registry import (
    InvalidArguments,
    Tool,
    ToolRegistry,
    UnknownTool,
    make_idempotency_key,
)
from lockgate.machine.tools.spec import Namespace
from lockgate.machine.values import limit_size, to_json
from lockgate.machine.webhooks import WebhookOutbox
from lockgate.machine.write_path import Carried, Step, WritePath
from lockgate.spec import ToolCallStatus as C

#: What an approval shows of a call's arguments (the page, the API, the paused answer): the
#: arguments themselves up to this size, else the start of their JSON text. The full
#: arguments are journaled whatever their size; only what a person reads is cut.
ARGUMENTS_PREVIEW_BYTES = 4096

#: The events of a call made with no intent written first (spec: `Composition.carried`):
#: its outcome, good or bad.
AT_LEAST_ONCE = ("succeed_at_least_once", "fail_at_least_once")
#: A call made at once was sent once.
_ONE = {"attempts": 1}
#: At most this many calls made at once wait in memory for the next durable commit; the
#: next one commits them first (with a checkpoint that keeps the last snapshot). Each entry
#: holds a result of at most `max_result_bytes`: 4 MiB an execution at the defaults.
MAX_CARRIED_CALLS = 64


def _outcome(tool: Tool, done: Dispatched) -> ToolOutcome:
    """What the code sees of a tool call's result."""
    if done.error is None:
        return Returned(done.value)
    return Raised("RuntimeError", f"tools.{tool.spec.full_name} failed: {done.error}")


class HandBack(Exception):
    """Raised inside a drive, at a step boundary, once this instance hands its work back."""


class Dispatcher:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        sandbox: Sandbox,
        registry: ToolRegistry | SourceBook,
        policy: PolicyBook,
        secrets: SecretStore,
        settings: Settings,
        clock: Callable[[], datetime],
        handing_back: threading.Event,
        webhooks: WebhookOutbox,
        notices: CallNotices | None = None,
    ) -> None:
        self.store, self.write, self.sandbox, self.webhooks = store, write, sandbox, webhooks
        #: Who hears what a tool says while it runs, by execution (best effort, not stored).
        self.notices = notices or CallNotices()
        #: Each principal's tools (the configured ones, and those stored for it).
        self.sources = as_source_book(registry)
        self.policy, self.secrets, self.settings, self.clock = policy, secrets, settings, clock
        self.budget = StorageBudget(store, settings.max_stored_bytes_per_principal)
        #: The driver's drain flag: set, no new sandbox step or dispatch begins here.
        self.handing_back = handing_back
        #: How a call pauses its execution (for approval, or for its tool's questions).
        self.pauses = CallPauses(write, webhooks, settings, clock)

    def call(
        self,
        ex: ExecutionRecord,
        suspended: Suspended,
        seq: int,
        carried: Carried,
        journaled: int,
    ) -> SandboxStep | None:
        """The code's call number `seq`: journal it and carry it to its outcome (or pause
        the execution for approval). `carried` holds the journal entries of calls made
        since the execution's last durable commit; they commit with the next one.
        `journaled` is the highest call number the journal held when the drive began: a
        call up to it is replayed from its row, one above it has none."""
        request = suspended.request
        call_id = make_idempotency_key(ex.id, seq)
        registry = self.sources.registry_for(principal_of(ex))
        limit = self.settings.max_call_argument_bytes  # before anything looks at them
        try:
            tool = registry.get(request.name)
            sent = to_json([list(request.args), dict(request.kwargs)]) if seq > journaled else []
            if refused := arguments_too_large(tool.spec.call_name, sent, limit) or (
                self.budget.refuses(ex, tool.spec.call_name, sent) if seq > journaled else None
            ):
                return self.resume_sandbox(ex, suspended.snapshot, refused)
            arguments = registry.validate_arguments(
                request.name, dict(request.kwargs), list(request.args)
            )
        except (UnknownTool, InvalidArguments) as exc:
            # Nothing was requested that could run: the code sees the error, no journal row.
            return self.resume_sandbox(ex, suspended.snapshot, Raised("TypeError", exc.message))
        existing = self.store.tool_calls.get(call_id) if seq <= journaled else None
        if existing is not None:
            if existing.tool != tool.spec.full_name:
                return self.resume_sandbox(
                    ex,
                    suspended.snapshot,
                    Raised(
                        "RuntimeError",
                        f"replaying after a restart, call {seq} asked for "
                        f"{tool.spec.call_name} but the journal recorded "
                        f"tools.{existing.tool}: the code is not deterministic",
                    ),
                )
            return self.advance(ex, record_of(existing), suspended.snapshot, carried)
        now = self.clock()
        row = new_row(
            ToolCall,
            id=call_id,
            execution_id=ex.id,
            seq=seq,
            tool=tool.spec.full_name,
            status=C.REQUESTED.value,
            idempotent=tool.spec.idempotent,
            arguments=arguments,
            arguments_preview=limit_size(arguments, ARGUMENTS_PREVIEW_BYTES),
            created_at=now,
            updated_at=now,
        )
        call = record_of(row)
        decision = self.policy.decide(tool.spec, principal_of(ex))
        cover = self._cover(ex, row) if decision is PolicyDecision.REQUIRE_APPROVAL else None
        if decision is PolicyDecision.APPROVE and not tool.spec.asks:
            # Made at once if the spec lets it be made again (idempotent, retries allowed):
            # no commit of its own. Otherwise it is journaled before it runs, below (as is a
            # tool that may ask its user for values: its questions pause a journaled call).
            try:
                outcome = self._call_at_least_once(ex, tool, call, row, carried)
            except GuardRefused:
                pass  # refused before the tool ran
            else:
                return self.resume_sandbox(ex, suspended.snapshot, outcome)
        checkpoint = self.settings.checkpoint_every_call
        # The call's row commits with the policy's decision and the execution's checkpoint,
        # in one transaction (with the calls carried so far).
        first = Step(
            ex,
            "checkpoint",
            {"snapshot": suspended.snapshot if checkpoint else ex.typed.snapshot},
            data={
                "calls_made": seq,
                "logs": ex.typed.logs,
                **({"snapshot_call": seq, "runtime_version": MONTY_VERSION} if checkpoint else {}),
            },
        )
        opening = Opening(first, row, carried)
        if decision is PolicyDecision.BLOCK:
            self.write.apply(
                *opening.steps,
                Step(call, "block"),
                inserts=opening.inserts,
                fence=ex,
                carried=carried,
            )
            return self.resume_sandbox(ex, suspended.snapshot, settled_outcome(call))
        if decision is PolicyDecision.APPROVE or cover is not None:
            self.go_on()  # not sent yet: the next owner sends it
            made = self._dispatch(ex, call, opening, suspended.snapshot, cover)
            if made is None:
                return None  # the tool asked its user: paused for the answers
            return self.resume_sandbox(ex, suspended.snapshot, made)
        self.pauses.for_approval(ex, call, suspended.snapshot, opening)
        return None

    def advance(
        self,
        ex: ExecutionRecord,
        call: CallRecord,
        snapshot: bytes,
        carried: Carried | None = None,
    ) -> SandboxStep | None:
        """Carry one stored journal row forward from whatever status it is in; returns the
        next sandbox step, or None when the execution paused. (A row rests in `requested`
        only if an earlier version left it there at a crash.)"""
        tool_name = call.typed.tool
        while True:
            status = call.status
            if status == C.REQUESTED:
                tool = self._tool(ex, tool_name)
                decision = self.policy.decide(tool.spec, principal_of(ex))
                if decision is PolicyDecision.BLOCK:
                    self.write.apply(Step(call, "block"), fence=ex, carried=carried)
                elif decision is PolicyDecision.APPROVE:
                    self.write.apply(Step(call, "auto_approve"), fence=ex, carried=carried)
                else:
                    self.pauses.for_approval(ex, call, snapshot, Opening(None, None, carried))
                    return None
            elif status in (C.APPROVED, C.DISPATCHED):
                if status == C.APPROVED:
                    self.go_on()  # not sent yet: the next owner sends it
                # A dispatched call (a requeued execution's idempotent one) is already out:
                # it is carried to its result, even while draining.
                outcome = self._dispatch(ex, call, Opening(None, None, carried), snapshot)
                if outcome is None:
                    return None  # the tool asked its user (again): paused for the answers
                return self.resume_sandbox(ex, snapshot, outcome)
            else:
                return self.resume_sandbox(ex, snapshot, settled_outcome(call))

    def resume_sandbox(
        self, ex: ExecutionRecord, snapshot: bytes, outcome: ToolOutcome
    ) -> SandboxStep:
        self.go_on()
        principal = principal_of(ex)
        return self.sandbox.resume(
            snapshot, outcome, principal=principal, namespace=self._namespace(principal)
        )

    def start_sandbox(self, ex: ExecutionRecord) -> SandboxStep:
        """Run a new execution's code to its first step, with its principal's tools."""
        self.go_on()
        principal = principal_of(ex)
        return self.sandbox.start(
            ex.typed.code, principal=principal, namespace=self._namespace(principal)
        )

    def _namespace(self, principal: str) -> Namespace | None:
        """The tools `principal`'s code finds (None: the sandbox's own, every principal's)."""
        registry = self.sources.registry_for(principal)
        return None if registry is self.sources.base else registry.frozen_namespace()

    def _cover(self, ex: ExecutionRecord, row: ToolCall) -> dict[str, JsonValue] | None:
        """The record of an earlier grant that approves this call instead of a person."""
        return covering(
            self.store.tool_calls.decided_of(ex.id, row.tool),
            arguments=row.arguments,
            policy=self.policy.for_principal(principal_of(ex)),
            now=self.clock(),
            max_calls=self.settings.max_calls,
        )

    def _tool(self, ex: ExecutionRecord, name: str) -> Tool:
        return self.sources.tool_for(principal_of(ex), name)

    def go_on(self) -> None:
        """Before work a drain must not wait for (a sandbox step, a dispatch): hand back."""
        if self.handing_back.is_set():
            raise HandBack()

    def _dispatch(
        self,
        ex: ExecutionRecord,
        call: CallRecord,
        opening: Opening,
        snapshot: bytes,
        cover: dict[str, JsonValue] | None = None,
    ) -> ToolOutcome | None:
        """Intent first: the dispatch commits (with the call's approval, and the grant that
        `cover`s it, and its row when they are new), then the tool runs, then its result
        commits. None when the tool asked its user for values instead: its questions commit
        with the execution's pause at `snapshot` (the code's state at this call)."""
        tool = self._tool(ex, call.typed.tool)
        steps = list(opening.steps)
        if call.status == C.REQUESTED:
            steps.append(Step(call, "auto_approve", {"decision": cover} if cover else {}))
        event = "redispatch" if call.status == C.DISPATCHED else "dispatch"
        attempts = call.typed.attempts + 1
        applied = self.write.apply(
            *steps,
            Step(call, event, data={"attempts": attempts}),
            effect=self._invocation(tool, ex, call),
            inserts=opening.inserts,
            fence=ex,  # only while this instance still holds the execution
            carried=opening.carried,
        )
        done = applied.effect_result
        assert done is not None
        if done.asked is not None:
            self.pauses.for_answers(ex, call, snapshot, done)
            return None
        if done.error is None:
            self.write.apply(Step(call, "succeed", {"result": {"value": done.value}}), fence=ex)
        else:
            self.write.apply(Step(call, "fail", {"result": {"error": done.error}}), fence=ex)
        return _outcome(tool, done)

    def _commit_carried(self, ex: ExecutionRecord, carried: Carried) -> None:
        """Commit the calls made at once so far, so memory holds a bounded number: with a
        checkpoint that keeps the last snapshot (the one at the next call would name a call
        not journaled yet), from which recovery replays them from the journal."""
        self.write.apply(
            Step(
                ex,
                "checkpoint",
                {"snapshot": ex.typed.snapshot},
                data={"calls_made": ex.typed.calls_made, "logs": ex.typed.logs},
            ),
            fence=ex,
            carried=carried,
        )

    def _call_at_least_once(
        self, ex: ExecutionRecord, tool: Tool, call: CallRecord, row: ToolCall, carried: Carried
    ) -> ToolOutcome:
        """Call `tool` now (the call's own, already looked up); its journal entry is carried
        to the next durable commit. `GuardRefused` (before anything ran) when the spec does
        not let it be made so."""
        self.go_on()
        if len(carried.decided) >= MAX_CARRIED_CALLS:
            self._commit_carried(ex, carried)

        def settle(done: Dispatched) -> Step:
            if done.error is None:
                return Step(call, AT_LEAST_ONCE[0], {"result": {"value": done.value}}, _ONE)
            return Step(call, AT_LEAST_ONCE[1], {"result": {"error": done.error}}, _ONE)

        done = self.write.carry(
            carried,
            settle,
            AT_LEAST_ONCE,
            self._invocation(tool, ex, call),
            inserts=[row],
            probe=call,
        )
        ex.typed.calls_made = call.typed.seq  # committed with the next durable step
        return _outcome(tool, done)

    def _invocation(
        self, tool: Tool, ex: ExecutionRecord, call: CallRecord
    ) -> Callable[[], Dispatched]:
        """The tool call as the write path runs it, with the journaled arguments."""
        arguments = call.typed.arguments
        given = arguments if isinstance(arguments, dict) else {}
        execution_id = ex.typed.id
        return lambda: invoke(
            tool,
            given,
            call_id=call.id,
            principal=ex.typed.principal_id,
            secrets=self.secrets,
            notify=lambda notice: self.notices.publish(execution_id, notice),
            answers=stored_answers(call.typed.input),
            max_result_bytes=self.settings.max_result_bytes,
        )
