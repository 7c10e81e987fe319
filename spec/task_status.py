"""How an execution is seen through the tasks extension (`io.modelcontextprotocol/tasks`):
the task status each execution state maps to, and why. A task IS its execution (the task id
is the execution id), so this is a view, not a lifecycle of its own: nothing here adds a
state or a transition, and every execution state must have a row (`unmapped()`, checked by
tests/processes/test_tasks.py; the table is drawn in diagrams/README.md).

The extension keeps `failed` for JSON-RPC errors; an execution whose code failed, expired or
was interrupted is a tool call that completed with `isError: true`, which the extension says
is `completed` with that result. The one exception is a direct tool's call (`expose =
"direct"`) whose tool failed unexpectedly (raised anything but an answer): that is an
internal error of the request, so the task is `failed` with -32603 (`server/tasks.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from lockgate.spec.execution import ExecutionStatus as E


class TaskStatus(StrEnum):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TaskView:
    status: TaskStatus
    why: str


T = TaskStatus

TASK_STATUS: Mapping[E, TaskView] = {
    E.PENDING: TaskView(T.WORKING, "accepted, not started yet"),
    E.RUNNING: TaskView(T.WORKING, "the code runs"),
    E.WAITING_FOR_INTERACTION: TaskView(
        T.INPUT_REQUIRED,
        "a call waits for approval: inputRequests holds the elicitation for it (in approval "
        "mode browser, where only the page decides, the task stays working instead)",
    ),
    E.COMPLETED: TaskView(T.COMPLETED, "result: execute's answer (a direct tool's: its own)"),
    E.FAILED: TaskView(
        T.COMPLETED,
        "result: the error answer (isError); a direct tool's fault: failed, error -32603",
    ),
    E.CANCELLED: TaskView(T.CANCELLED, "the approver cancelled, or tasks/cancel"),
    E.EXPIRED: TaskView(T.COMPLETED, "result: the expiry error (isError)"),
    E.INTERRUPTED: TaskView(T.COMPLETED, "result: the interruption error (isError)"),
}


def unmapped() -> list[str]:
    """Execution states with no task status (must be none)."""
    return [state.value for state in E if state not in TASK_STATUS]


__all__ = ["TASK_STATUS", "TaskStatus", "TaskView", "unmapped"]
