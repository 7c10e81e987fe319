"""Answers to what a tool asked its user (`machine.tools.questions`), applied to its paused
execution: each checked against its question, stored (some now, the rest later, from any
client on any instance), and once the last open question is answered, the call is made again
with every answer and the execution goes on, in one transaction (spec: `take_answers`,
`answer` with `resume`).

Two clients answering different questions at once both land: a write that lost the race
reads the call again and applies what is still open (the version check makes the loser
retry, never overwrite)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import JsonValue

from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore
from lockgate.machine.dispatcher import CallRecord, Dispatcher, ExecutionRecord, record_of
from lockgate.machine.driver import Driver
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    InvalidExecutionInput,
)
from lockgate.machine.execution_reads import ExecutionReads
from lockgate.machine.sandbox import MONTY_VERSION, RuntimeMismatch, sealed_version
from lockgate.machine.tools.questions import open_questions, problems
from lockgate.machine.tools.registry import make_idempotency_key
from lockgate.machine.views import ExecutionView
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C

#: How often a write of answers that lost a race to another is tried again on fresh rows.
ATTEMPTS = 5


class NotAsking(InvalidExecutionInput):
    """Answers sent to an execution whose call asks nothing (it waits for approval)."""


class NotApproval(InvalidExecutionInput):
    """A decision sent to an execution whose call asks questions (nothing to approve)."""


class InvalidAnswer(InvalidExecutionInput):
    """An answer that does not answer its question (its shape, or its values)."""


class CallAnswers:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        reads: ExecutionReads,
        driver: Driver,
        dispatcher: Dispatcher,
        owner: str,
        expire_if_due: Callable[[Execution], Execution],
    ) -> None:
        self.store, self.write, self.reads = store, write, reads
        self.driver, self.dispatcher, self.owner = driver, dispatcher, owner
        self._expire_if_due = expire_if_due

    def give(
        self,
        execution_id: str,
        principal_id: str,
        responses: Mapping[str, JsonValue],
        *,
        expected_call: int | None = None,
    ) -> ExecutionView:
        """Apply the answers in `responses` (by question key) to the call the execution
        waits on (with `expected_call`: only if it is that call), and once the last one is
        in, run the execution on. Keys that name no open question are ignored (answered
        already, or never asked), as MCP has a server do; an answer that does not fit its
        question is refused in words, nothing stored."""
        view, go_on = self.take(execution_id, principal_id, responses, expected_call=expected_call)
        if go_on is None:
            return view
        go_on()
        return self.reads.view(execution_id)

    def take(
        self,
        execution_id: str,
        principal_id: str,
        responses: Mapping[str, JsonValue],
        *,
        expected_call: int | None = None,
    ) -> tuple[ExecutionView, Callable[[], None] | None]:
        """What `give` stores, without running the execution on: the view as stored, and,
        once the last answer is in, what runs it on (the caller's to run, or to leave
        running in the background: a client that answers is told at once that its answers
        are stored, or why they are refused, before the code goes on)."""
        for _ in range(ATTEMPTS):
            row = self._expire_if_due(self.reads.owned(execution_id, principal_id))
            if row.status == E.EXPIRED:
                deadline = row.deadline.isoformat() if row.deadline else None
                raise ExecutionExpired(execution_id=row.id, deadline=deadline)
            if row.status != E.WAITING_FOR_INTERACTION or row.snapshot_call is None:
                raise ExecutionAlreadySettled(
                    execution_id=row.id, status=row.status, detail="nothing waits for answers"
                )
            if expected_call is not None and row.snapshot_call != expected_call:
                raise ExecutionAlreadySettled(
                    execution_id=row.id,
                    status=row.status,
                    detail="the answers were for an earlier tool call",
                )
            call_row = self.store.tool_calls.get(make_idempotency_key(row.id, row.snapshot_call))
            if call_row is None or call_row.status != C.AWAITING_INPUT:
                raise NotAsking(
                    f"Execution {row.id!r} waits for a decision on its tool call, not for "
                    "answers to questions.",
                    hint="Accept or decline the call (resume with an action), or cancel it.",
                )
            asked = open_questions(call_row.input)
            given = {key: value for key, value in responses.items() if key in asked}
            for key, value in given.items():
                problem = problems(asked[key], value)
                if problem is not None:
                    raise InvalidAnswer(
                        f"The answer to {key!r} does not fit its question: {problem}.",
                        hint="Send it again as the question's form asks (inputRequests "
                        "shows each question's schema).",
                    )
            if not given:
                return self.reads.view(row.id), None
            ex, call = record_of(row), record_of(call_row)
            facts = {"answers": given, "deadline": row.deadline}
            if len(given) < len(asked):
                try:
                    self.write.apply(Step(call, "take_answers", facts))
                except (Conflict, GuardRefused, IllegalTransition):
                    continue  # another answer came first: read again, apply what is open
                return self.reads.view(row.id), None
            snapshot = row.snapshot
            if snapshot is None:
                raise RuntimeError(f"paused execution {row.id} has no snapshot")
            made_by = sealed_version(snapshot)
            if made_by != MONTY_VERSION:  # refused before the answers are consumed
                raise RuntimeMismatch(sealed_version=made_by)
            try:
                self.write.apply(
                    Step(call, "answer", facts), Step(ex, "resume", {"owner": self.owner})
                )
            except (Conflict, GuardRefused, IllegalTransition):
                continue
            return self.reads.view(row.id), self._go_on(ex, call, snapshot)
        return self.reads.view(execution_id), None

    def _go_on(self, ex: ExecutionRecord, call: CallRecord, snapshot: bytes) -> Callable[[], None]:
        """What runs the execution on from its pause: the answered call is made again first."""
        seq = call.typed.seq

        def go_on() -> None:
            self.driver.drive(
                ex, lambda: (self.dispatcher.advance(ex, call, snapshot), seq), after="answers"
            )

        return go_on
