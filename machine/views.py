"""What clients see of an execution: a read model built from its row and its journal."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, JsonValue

from lockgate.machine.db.execution_queries import CallLine
from lockgate.machine.db.schema import Execution
from lockgate.machine.tools.questions import open_questions, stored_input
from lockgate.spec import ExecutionStatus, ToolCallStatus


class PendingCall(BaseModel):
    """The tool call a paused execution waits on."""

    seq: int
    tool: str
    arguments_preview: JsonValue
    deadline: datetime | None
    message: str
    #: What the call's tool asked its user and is still open, by key (each an MCP
    #: `elicitation/create` request); None when the call waits for approval instead.
    questions: dict[str, JsonValue] | None = None
    #: The tool needs the answers before the call is worth a task (`ToolContext.ask`).
    before_task: bool = False


class CallSummary(BaseModel):
    seq: int
    tool: str
    status: ToolCallStatus


class ExecutionView(BaseModel):
    id: str
    status: ExecutionStatus
    principal_id: str
    session_id: str | None
    result: JsonValue = None
    error: JsonValue = None
    logs: str = ""
    pending: PendingCall | None = None
    what_ran: JsonValue = None
    calls: list[CallSummary] = []
    #: The direct tool whose call this is (it answers as that tool); None for code.
    direct_tool: str | None = None
    created_at: datetime
    updated_at: datetime

    @property
    def terminal(self) -> bool:
        return self.status not in (
            ExecutionStatus.PENDING,
            ExecutionStatus.RUNNING,
            ExecutionStatus.WAITING_FOR_INTERACTION,
        )


def approval_message(tool: str) -> str:
    return f"Approve the call to tools.{tool}? Review the arguments before you accept."


def questions_message(tool: str) -> str:
    return f"tools.{tool} asks its user for values before it goes on: answer its questions."


def build_view(row: Execution, calls: list[CallLine]) -> ExecutionView:
    outcome = row.outcome if isinstance(row.outcome, dict) else {}
    pending: PendingCall | None = None
    if row.status == ExecutionStatus.WAITING_FOR_INTERACTION:
        call = next((c for c in calls if c.seq == row.snapshot_call), None)
        if call is not None:
            asking = call.status == ToolCallStatus.AWAITING_INPUT
            pending = PendingCall(
                seq=call.seq,
                tool=call.tool,
                arguments_preview=call.arguments_preview,
                deadline=row.deadline,
                message=questions_message(call.tool) if asking else approval_message(call.tool),
                questions=open_questions(call.input) if asking else None,
                before_task=asking and bool(stored_input(call.input).get("before_task")),
            )
    return ExecutionView(
        id=row.id,
        status=ExecutionStatus(row.status),
        principal_id=row.principal_id,
        session_id=row.session_id,
        result=outcome.get("result"),
        error=outcome.get("error"),
        logs=row.logs,
        pending=pending,
        what_ran=row.what_ran,
        calls=[CallSummary(seq=c.seq, tool=c.tool, status=ToolCallStatus(c.status)) for c in calls],
        direct_tool=row.direct_tool,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
