"""What a client is told about a request the server lost: the -32010 error, naming what
became of the request's execution and what to do next."""

from __future__ import annotations

import json

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
    request started none). Re-executing is suggested only when nothing ran.

    The message alone says what happened and what to do next, naming the execution: most
    clients show a model only the message, never `data` (which holds the same facts, typed).
    Every sentence is true whatever lost the request (a crash, a drain, the response
    deadline, a broken stream): the status is read now, after recovery took over.
    """
    lost = (
        f"The server lost request {json.dumps(row.request_id)} ({row.method}) before "
        "answering it (it restarted, shut down, or the stream broke)."
    )
    data: dict[str, JsonValue] = {"requestMethod": row.method}
    if execution is None:
        data["executionId"] = None
        data["next"] = "re-execute"
        data["hint"] = "The request started no execution: nothing ran. Send it again."
    else:
        status = execution.status
        name = execution.id
        data["executionId"] = name
        data["status"] = status
        # Not `live_names`: a paused execution is reported as paused, not running.
        if status in (E.PENDING, E.RUNNING):
            state = "is running" if status == E.RUNNING else "is queued to run again"
            data["next"] = "wait"
            data["hint"] = (
                f"Execution {name} {state}: call `resume` with executionId={name} and no "
                "action to wait for its result."
            )
        elif status == E.WAITING_FOR_INTERACTION:
            data["next"] = "resume"
            data["hint"] = (
                f"Execution {name} is paused for approval: call `resume` with "
                f"executionId={name} and no action to see the call and its approval link "
                "(decline or cancel give it up; accept only where the server lets the agent "
                "approve)."
            )
        elif status == E.INTERRUPTED:
            data["whatRan"] = execution.what_ran
            data["next"] = "check"
            data["hint"] = (
                f"Execution {name} was interrupted: a call may or may not have taken effect "
                "(whatRan in the error data, or `resume` with this executionId and no action, "
                "names the calls that ran and the one in doubt). Check it before running the "
                "code again."
            )
        else:
            data["next"] = "fetch"
            data["hint"] = (
                f"Execution {name} is {status}: call `resume` with executionId={name} and no "
                "action to read its outcome."
            )
    return {
        "jsonrpc": "2.0",
        "id": row.request_id,
        "error": {"code": REQUEST_LOST, "message": f"{lost} {data['hint']}", "data": data},
    }
