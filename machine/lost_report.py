"""What a client is told about a request the server lost: the -32010 error, naming what
became of the request's execution and what to do next."""

from __future__ import annotations

from pydantic import JsonValue

from lockgate.machine.db.schema import Execution, OwedRequest
from lockgate.spec import ExecutionStatus as E

#: JSON-RPC code of "the server lost this request" (implementation-defined range).
REQUEST_LOST = -32010


def request_key(session_id: str, request_id: JsonValue) -> str:
    """One id for (session, JSON-RPC id): numbers and strings stay distinct. An execution
    started by a request records it as its origin, so a report can find it."""
    return f"{session_id}:{request_id!r}"


def lost_error(row: OwedRequest, execution: Execution | None) -> dict[str, JsonValue]:
    """The -32010 error for a lost request whose execution is `execution` (None when the
    request started none). Re-executing is suggested only when nothing ran."""
    data: dict[str, JsonValue] = {"requestMethod": row.method}
    if execution is None:
        data["executionId"] = None
        data["next"] = "re-execute"
        data["hint"] = (
            "The server stopped before this request started any execution: nothing ran. "
            "Send it again."
        )
    else:
        status = execution.status
        data["executionId"] = execution.id
        data["status"] = status
        # Not `live_names`: a paused execution is reported as paused, not running.
        if status in (E.PENDING, E.RUNNING):
            data["next"] = "wait"
            data["hint"] = (
                "The execution was recovered and is running again: call `resume` with this "
                "executionId and no action to get its result."
            )
        elif status == E.WAITING_FOR_INTERACTION:
            data["next"] = "resume"
            data["hint"] = (
                "The execution is paused for approval: call `resume` with this executionId "
                "and action accept, decline or cancel."
            )
        elif status == E.INTERRUPTED:
            data["whatRan"] = execution.what_ran
            data["next"] = "check"
            data["hint"] = (
                "The execution was interrupted; whatRan names the calls that ran and the "
                "call in doubt. Check it before running the code again."
            )
        else:
            data["next"] = "fetch"
            data["hint"] = (
                f"The execution is {status}: call `resume` with this executionId and no "
                "action to read its outcome."
            )
    return {
        "jsonrpc": "2.0",
        "id": row.request_id,
        "error": {
            "code": REQUEST_LOST,
            "message": "The server lost this request (it restarted or the stream broke) "
            "before answering it.",
            "data": data,
        },
    }
