"""What a person is shown of a call waiting for approval, whole, and its digest.

The page and the inbox show every argument and the code in full; the decision they send
carries the digest of exactly that, and the decision entry refuses an accept whose digest
is not the one of the call as it is stored (`server/decisions.py`): nobody approves a tail
they were not shown, or a call that changed under the page.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine.db.store import SqlStore
from lockgate.machine.tools.spec import make_idempotency_key
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C


@dataclass(frozen=True)
class CallShown:
    execution_id: str
    call: int
    principal: str
    tool: str
    arguments: JsonValue
    code: str
    #: Whether the call still waits for a decision (else: decided, expired, withdrawn).
    waiting: bool
    expires_at: datetime | None

    @property
    def digest(self) -> str:
        """sha256 of what the person reads, canonical JSON: the decision must name it."""
        shown = [self.execution_id, self.call, self.principal, self.tool, self.arguments, self.code]
        text = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def as_json(self) -> dict[str, JsonValue]:
        return {
            "executionId": self.execution_id,
            "call": self.call,
            "requestedBy": self.principal,
            "tool": f"tools.{self.tool}",
            "arguments": self.arguments,
            "code": self.code,
            "waiting": self.waiting,
            "expiresAt": self.expires_at.isoformat() if self.expires_at else None,
            "digest": self.digest,
        }


def call_shown(store: SqlStore, execution_id: str, call: int) -> CallShown | None:
    """The call as stored (None: no such execution or call)."""
    execution = store.executions.get(execution_id)
    row = store.tool_calls.get(make_idempotency_key(execution_id, call))
    if execution is None or row is None:
        return None
    waiting = (
        execution.status == E.WAITING_FOR_INTERACTION
        and execution.snapshot_call == call
        and row.status == C.AWAITING_APPROVAL
    )
    return CallShown(
        execution_id=execution_id,
        call=call,
        principal=execution.principal_id,
        tool=row.tool,
        arguments=row.arguments,
        code=execution.code,
        waiting=waiting,
        expires_at=execution.deadline if waiting else None,
    )


def page_url(base_url: str, execution_id: str, call: int) -> str:
    """The approval page of a call: it names the call and authorises nothing (opening it
    asks the person to sign in)."""
    return f"{base_url}/approve/{execution_id}/{call}"
