"""What the meta-tools answer: structuredContent in the executor project's shapes, plus a
readable text for models that only read text."""

from __future__ import annotations

import json
from dataclasses import dataclass

import mcp_types as types
from pydantic import JsonValue

from lockgate.machine.errors import LockgateError
from lockgate.machine.tools.questions import form_of
from lockgate.machine.views import ExecutionView
from lockgate.spec import ExecutionStatus as E


@dataclass(frozen=True)
class Running:
    """The code outlived the wait budget; it goes on in the background."""

    execution_id: str


def _result(structured: dict[str, JsonValue], text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=error,
    )


def running(execution_id: str, status: str = E.RUNNING) -> types.CallToolResult:
    return _result(
        {"status": "running", "executionId": execution_id, "executionStatus": status},
        f"Execution {execution_id} is still running. Call `resume` with this executionId "
        "(and no action) to wait for its result.",
        error=False,
    )


def error_status(err: LockgateError) -> str:
    """Resume errors are named `execution_<case>`; others keep their code."""
    code = str(err.code)
    named = {"not_found", "expired", "forbidden", "already_settled", "interrupted"}
    return f"execution_{code}" if code in named else "error"


def _lifecycle_status(err: LockgateError) -> str | None:
    """The execution's own status, when the error says what it is."""
    from lockgate.machine.execution_errors import (
        ExecutionAlreadySettled,
        ExecutionExpired,
        ExecutionInterrupted,
    )

    if isinstance(err, ExecutionAlreadySettled):
        return str(err.status)
    if isinstance(err, ExecutionExpired):
        return E.EXPIRED.value
    if isinstance(err, ExecutionInterrupted):
        return E.INTERRUPTED.value
    return None


def error(err: LockgateError, execution_id: str | None = None) -> types.CallToolResult:
    body = err.as_dict()
    structured: dict[str, JsonValue] = {"status": error_status(err), "error": body}
    if execution_id:
        structured["executionId"] = execution_id
        status = _lifecycle_status(err)
        if status is not None:
            structured["executionStatus"] = status
    if err.hint:
        structured["hint"] = err.hint
    text = err.message + (f" {err.hint}" if err.hint else "")
    return _result(structured, text, error=True)


def invalid(message: str) -> types.CallToolResult:
    return _result(
        {"status": "error", "error": {"code": "invalid_arguments", "message": message}},
        message,
        error=True,
    )


def internal_error() -> types.CallToolResult:
    message = "The server failed to handle this call; it was logged. Try again."
    return _result(
        {"status": "error", "error": {"code": "internal_error", "message": message}},
        message,
        error=True,
    )


def _asking(view: ExecutionView) -> types.CallToolResult:
    """A paused call whose tool asked its user questions this client could not be asked
    (it declared no elicitation): the questions, and how to answer them."""
    pending = view.pending
    assert pending is not None and pending.questions is not None
    expires = pending.deadline.isoformat() if pending.deadline else None
    said = "; ".join(
        f"{key}: {form_of(request)[0]!r}" for key, request in pending.questions.items()
    )
    return _result(
        {
            "status": "waiting_for_interaction",
            "executionId": view.id,
            "executionStatus": view.status,
            "expiresAt": expires,
            "interaction": {
                "kind": "questions",
                "message": pending.message,
                "tool": f"tools.{pending.tool}",
                "questions": pending.questions,
            },
            "logs": view.logs,
        },
        f"tools.{pending.tool} asks its user before it goes on ({said}). Ask the user, then "
        f"call `resume` with executionId={view.id} and answers: an object with one entry per "
        'question key, each {"action": "accept", "content": {...the values...}} (or '
        '"decline" / "cancel"); or cancel the execution with `resume`. '
        f"Expires at {expires}.",
        error=False,
    )


def execution(
    view: ExecutionView, approval_url: str | None, *, model_accepts: bool = True
) -> types.CallToolResult:
    """The answer about `view`; `model_accepts`: whether the agent may accept a call itself
    (approval mode `model`), which decides what a paused answer tells it to do."""
    eid = view.id
    if view.status == E.COMPLETED:
        return _result(
            {
                "status": "completed",
                "executionId": eid,
                "executionStatus": view.status,
                "result": view.result,
                "logs": view.logs,
            },
            f"Completed. Result: {json.dumps(view.result)}"
            + (f"\nLogs:\n{view.logs}" if view.logs else ""),
            error=False,
        )
    if (
        view.status == E.WAITING_FOR_INTERACTION
        and view.pending is not None
        and view.pending.questions is not None
    ):
        return _asking(view)
    if view.status == E.WAITING_FOR_INTERACTION and view.pending is not None:
        pending = view.pending
        expires = pending.deadline.isoformat() if pending.deadline else None
        interaction: dict[str, JsonValue] = {
            "kind": "url",
            "message": pending.message,
            "tool": f"tools.{pending.tool}",
            "argsPreview": pending.arguments_preview,
            "approvalUrl": approval_url,
        }
        return _result(
            {
                "status": "waiting_for_interaction",
                "executionId": eid,
                "executionStatus": view.status,
                "expiresAt": expires,
                "interaction": interaction,
                "logs": view.logs,
            },
            f"Waiting for approval of tools.{pending.tool} with arguments "
            f"{json.dumps(pending.arguments_preview)}. "
            + (
                f"A person can approve at {approval_url}, or call `resume` with "
                f"executionId={eid} and action accept, decline or cancel. "
                if model_accepts
                else f"A person must approve it at {approval_url} (you cannot accept it): "
                f"ask the user to, then call `resume` with only executionId={eid} for the "
                "result; or decline or cancel it yourself with `resume`. "
            )
            + f"Expires at {expires}.",
            error=False,
        )
    if view.status in (E.RUNNING, E.PENDING):
        return running(eid, view.status)
    if view.status == E.FAILED:
        err: dict[str, JsonValue] = (
            view.error if isinstance(view.error, dict) else {"message": str(view.error)}
        )
        return _result(
            {
                "status": "error",
                "executionId": eid,
                "executionStatus": view.status,
                "error": err,
                "logs": view.logs,
            },
            f"The code failed: {err.get('message')}"
            + (f"\nLogs:\n{view.logs}" if view.logs else ""),
            error=True,
        )
    # cancelled, expired, interrupted: final, and not a result.
    from lockgate.machine.execution_errors import (
        ExecutionAlreadySettled,
        ExecutionExpired,
        ExecutionInterrupted,
    )

    if view.status == E.EXPIRED:
        return error(ExecutionExpired(execution_id=eid, deadline=None), eid)
    if view.status == E.INTERRUPTED:
        return error(ExecutionInterrupted(execution_id=eid, what_ran=view.what_ran), eid)
    return error(
        ExecutionAlreadySettled(execution_id=eid, status=view.status, detail="it was cancelled"),
        eid,
    )
