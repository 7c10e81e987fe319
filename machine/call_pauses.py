"""How a tool call pauses its execution, in one transaction with it: for a person's approval
(its `approval.requested` event in the outbox with them), or for answers to what its tool
asked its user (`machine.tools.questions`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from lockgate.machine import tracing
from lockgate.machine.db.schema import ToolCall
from lockgate.machine.journal_records import CallRecord, ExecutionRecord
from lockgate.machine.sandbox import MONTY_VERSION
from lockgate.machine.settings import Settings
from lockgate.machine.tool_invocation import Dispatched
from lockgate.machine.webhooks import WebhookOutbox
from lockgate.machine.write_path import Carried, Step, WritePath


@dataclass(frozen=True)
class Opening:
    """What commits with a new call's first step: the execution's checkpoint and the
    call's row (None for a stored call), and the calls carried so far."""

    checkpoint: Step | None
    row: ToolCall | None
    carried: Carried | None

    @property
    def steps(self) -> tuple[Step, ...]:
        return (self.checkpoint,) if self.checkpoint is not None else ()

    @property
    def inserts(self) -> tuple[ToolCall, ...]:
        return (self.row,) if self.row is not None else ()


class CallPauses:
    def __init__(
        self,
        write: WritePath,
        webhooks: WebhookOutbox,
        settings: Settings,
        clock: Callable[[], datetime],
    ) -> None:
        self.write, self.webhooks, self.settings, self.clock = write, webhooks, settings, clock

    def for_approval(
        self, ex: ExecutionRecord, call: CallRecord, snapshot: bytes, opening: Opening
    ) -> None:
        """The call's request for approval and the execution's pause, in one transaction
        (with the call's row and the checkpoint when the call is new)."""
        deadline = self.clock() + self.settings.approval_ttl
        # Its `approval.requested` event commits with it (the outbox, `machine.webhooks`).
        events = self.webhooks.rows_for_pause(ex.typed, call.typed, deadline)
        self.write.apply(
            *opening.steps,
            Step(call, "request_approval", {"arguments_preview": call.typed.arguments_preview}),
            Step(
                ex,
                "pause",
                {"snapshot": snapshot, "deadline": deadline},
                data={
                    "snapshot_call": call.typed.seq,
                    "runtime_version": MONTY_VERSION,
                    "logs": ex.typed.logs,
                },
            ),
            inserts=[*opening.inserts, *events],
            # Checked before the row is inserted: a stale owner is refused as the conflict
            # it is, not as a duplicate of the row the execution's new owner inserted.
            fence=ex,
            carried=opening.carried,
        )
        tracing.moment(
            "lockgate.pause",
            tracing.attributes_of(
                execution_id=ex.id, call=call.typed.seq, tool=call.typed.tool, waits_for="approval"
            ),
        )

    def for_answers(
        self, ex: ExecutionRecord, call: CallRecord, snapshot: bytes, done: Dispatched
    ) -> None:
        """The tool's questions and the execution's pause, in one transaction. No approval
        event goes out: a question is for the client waiting on the call, not the page."""
        deadline = self.clock() + self.settings.approval_ttl
        self.write.apply(
            Step(call, "ask", {"asked": done.asked, "before_task": done.before_task}),
            Step(
                ex,
                "pause",
                {"snapshot": snapshot, "deadline": deadline},
                data={
                    "snapshot_call": call.typed.seq,
                    "runtime_version": MONTY_VERSION,
                    "logs": ex.typed.logs,
                },
            ),
            fence=ex,
        )
        tracing.moment(
            "lockgate.pause",
            tracing.attributes_of(
                execution_id=ex.id, call=call.typed.seq, tool=call.typed.tool, waits_for="answers"
            ),
        )
