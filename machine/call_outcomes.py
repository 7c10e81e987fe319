"""What agent code sees of a tool call that settled without running now: a stored result,
a refusal (blocked, declined, cancelled); and the decisions a person can make."""

from __future__ import annotations

from enum import StrEnum

from lockgate.machine.journal_records import CallRecord
from lockgate.machine.sandbox_results import Raised, Returned, ToolOutcome
from lockgate.spec import ToolCallStatus as C


class Action(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"


#: The exception type agent code sees for a call that did not happen (catchable as
#: `PermissionError` or `Exception`).
REFUSED = "PermissionError"


def settled_outcome(call: CallRecord) -> ToolOutcome:
    tool = f"tools.{call.typed.tool}"
    status = call.status
    result = call.typed.result
    if status == C.SUCCEEDED and isinstance(result, dict):
        return Returned(result.get("value"))
    if status == C.FAILED and isinstance(result, dict):
        return Raised("RuntimeError", f"{tool} failed: {result.get('error')}")
    if status == C.BLOCKED:
        return Raised(REFUSED, f"{tool} is blocked by the server's policy")
    if status == C.DECLINED:
        decision = call.typed.decision
        action = decision.get("action") if isinstance(decision, dict) else "decline"
        verb = "cancelled" if action == Action.CANCEL else "declined"
        return Raised(REFUSED, f"the call to {tool} was {verb} by the approver")
    raise RuntimeError(f"call {call.id} cannot be resumed from {status!r}")
