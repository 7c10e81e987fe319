"""What agent code sees of a tool call that settled without running now: a stored result,
a refusal (blocked, declined, cancelled), arguments too large to journal; and the decisions
a person can make."""

from __future__ import annotations

from enum import StrEnum

from pydantic import JsonValue

from lockgate.machine.journal_records import CallRecord
from lockgate.machine.sandbox_results import Raised, Returned, ToolOutcome
from lockgate.machine.values import json_size
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


def arguments_too_large(call_name: str, arguments: JsonValue, limit: int) -> Raised | None:
    """The error for arguments over LOCKGATE_MAX_CALL_ARGUMENT_BYTES (None when within):
    checked before a call is journaled, since nobody approves what they cannot read."""
    size = json_size(arguments)
    if size <= limit:
        return None
    return Raised(
        "ValueError",
        f"The arguments of {call_name} are {size} bytes of JSON, over the limit of {limit} "
        "bytes for one call (LOCKGATE_MAX_CALL_ARGUMENT_BYTES): a person must be able to "
        "read everything they approve. Send less in one call (split the data over several "
        "calls, or pass a reference to it).",
    )
