"""The approval API's JSON answers: the execution as an approver sees it, and refusals.

Every refusal of the API is a JSON problem with a stable code (`problem`), whether a
handler raised it as a `Refusal` or the engine raised a `LockgateError`; the headers in
`NO_STORE` go with every approval answer, JSON or HTML.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.views import ExecutionView

#: Characters of the code shown on the page and in the API.
CODE_EXCERPT_CHARS = 2000

STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.EXPIRED: 410,
    ErrorCode.ALREADY_SETTLED: 409,
    ErrorCode.INTERRUPTED: 409,
    ErrorCode.RUNTIME_MISMATCH: 409,
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.LIMIT_REACHED: 429,
}
#: Sent with every answer: nothing here may be cached, framed (clickjacking an Approve
#: button) or leak its URL through a Referer.
NO_STORE = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class Refusal(Exception):
    """An HTTP refusal with a stable code, raised inside a handler and answered as JSON."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        hint: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.hint = status, code, message, hint
        self.headers = headers or {}


def problem(
    status: int,
    code: str,
    message: str,
    hint: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if hint:
        body["error"]["hint"] = hint
    return JSONResponse(body, status_code=status, headers={**NO_STORE, **(headers or {})})


def refused(exc: Refusal) -> JSONResponse:
    return problem(exc.status, exc.code, exc.message, exc.hint, exc.headers)


def from_error(exc: LockgateError) -> JSONResponse:
    return problem(STATUS_OF.get(exc.code, 400), str(exc.code), exc.message, exc.hint)


def _excerpt(code: str) -> str:
    if len(code) <= CODE_EXCERPT_CHARS:
        return code
    return code[:CODE_EXCERPT_CHARS] + f"\n… ({len(code) - CODE_EXCERPT_CHARS} more characters)"


def public_view(view: ExecutionView, code: str) -> dict[str, Any]:
    """The execution as the page and the API show it: no more of the code than an excerpt."""
    pending = view.pending
    return {
        "executionId": view.id,
        "status": str(view.status),
        "requestedBy": view.principal_id,
        "code": _excerpt(code),
        "tool": f"tools.{pending.tool}" if pending else None,
        "argsPreview": pending.arguments_preview if pending else None,
        "expiresAt": pending.deadline.isoformat() if pending and pending.deadline else None,
        "result": view.result,
        "error": view.error,
    }
