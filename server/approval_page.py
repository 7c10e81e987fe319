"""The browser approval: a page at the approval URL and the small REST API behind it.

The approval URL carries a single-use token bound to one paused call. The page's POST sends
the token in a custom header with a JSON body, which a cross-site form cannot do (and a
cross-site script cannot without a CORS preflight we never grant); an Origin header, when
present, must be this server's. The API also accepts a principal's Bearer key.
"""

from __future__ import annotations

import html
import json
from typing import Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from machine.db.schema import Execution
from machine.engine import Action
from machine.errors import ErrorCode, LockgateError
from machine.runtime import Runtime
from machine.views import ExecutionView
from server.approval_tokens import ApprovalTokens, TokenRefused
from server.auth import bearer_token
from server.keys import ApiKeys
from server.runner import ExecutionRunner
from server.shapes import Running

TOKEN_HEADER = "x-approval-token"

STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.EXPIRED: 410,
    ErrorCode.ALREADY_SETTLED: 409,
    ErrorCode.INTERRUPTED: 409,
    ErrorCode.RUNTIME_MISMATCH: 409,
    ErrorCode.INVALID_INPUT: 400,
}


class ResumeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline", "cancel"]
    content: JsonValue = None


def problem(status: int, code: str, message: str, hint: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if hint:
        body["error"]["hint"] = hint
    return JSONResponse(body, status_code=status)


def from_error(exc: LockgateError) -> JSONResponse:
    return problem(STATUS_OF.get(exc.code, 400), str(exc.code), exc.message, exc.hint)


def public_view(view: ExecutionView, code: str) -> dict[str, Any]:
    pending = view.pending
    excerpt = code if len(code) <= 2000 else code[:2000] + "\n…"
    return {
        "executionId": view.id,
        "status": str(view.status),
        "requestedBy": view.principal_id,
        "code": excerpt,
        "tool": f"tools.{pending.tool}" if pending else None,
        "argsPreview": pending.arguments_preview if pending else None,
        "expiresAt": pending.deadline.isoformat() if pending and pending.deadline else None,
        "result": view.result,
        "error": view.error,
    }


class ApprovalSurface:
    def __init__(
        self, runtime: Runtime, runner: ExecutionRunner, keys: ApiKeys, tokens: ApprovalTokens
    ) -> None:
        self.runtime, self.runner, self.keys, self.tokens = runtime, runner, keys, tokens

    def approval_url(self, view: ExecutionView) -> str | None:
        """Mint a fresh single-use link for the call a paused execution waits on."""
        if view.pending is None or view.pending.deadline is None:
            return None
        token = self.tokens.mint(
            view.id, view.pending.seq, view.principal_id, view.pending.deadline
        )
        return f"{self.runtime.settings.base_url}/approve/{token}"

    def _code(self, execution_id: str) -> str:
        with self.runtime.engine.store.session() as s:
            row = s.get(Execution, execution_id)
        return row.code if row is not None else ""

    async def _principal(self, request: Request, execution_id: str) -> str | LockgateError:
        """Who may act: the approval token's principal, or the Bearer key's."""
        token = request.headers.get(TOKEN_HEADER)
        if token:
            try:
                row = await to_thread.run_sync(self.tokens.check, token, execution_id)
            except TokenRefused as exc:
                return exc
            return row.principal_id
        key = bearer_token(request.scope)
        principal = await to_thread.run_sync(self.keys.authenticate, key) if key else None
        if principal is None:
            return TokenRefused(
                "unknown", "Send the approval token (X-Approval-Token) or an API key."
            )
        return principal

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.get("/api/executions/{execution_id}")
        async def get_execution(execution_id: str, request: Request) -> Response:
            who = await self._principal(request, execution_id)
            if isinstance(who, LockgateError):
                return from_error(who)
            try:
                view = await to_thread.run_sync(self.runtime.engine.get, execution_id, who)
            except LockgateError as exc:
                return from_error(exc)
            code = await to_thread.run_sync(self._code, execution_id)
            return JSONResponse(public_view(view, code))

        @router.post("/api/executions/{execution_id}/resume")
        async def resume(execution_id: str, request: Request) -> Response:
            origin = request.headers.get("origin")
            if origin is not None and origin.rstrip("/") != _own_origin(request):
                return problem(403, "forbidden", "Cross-site requests are refused.")
            if not request.headers.get("content-type", "").startswith("application/json"):
                return problem(415, "invalid_input", "Send the decision as application/json.")
            try:
                body = ResumeBody.model_validate_json(await request.body())
            except ValidationError:
                return problem(
                    400,
                    "invalid_input",
                    'The body must be {"action": "accept" | "decline" | "cancel"}.',
                )
            token = request.headers.get(TOKEN_HEADER)
            if token:
                try:
                    row = await to_thread.run_sync(self.tokens.consume, token, execution_id)
                except TokenRefused as exc:
                    return from_error(exc)
                principal = row.principal_id
            else:
                who = await self._principal(request, execution_id)
                if isinstance(who, LockgateError):
                    return from_error(who)
                principal = who
            try:
                outcome = await self.runner.resume(
                    principal, execution_id, Action(body.action), body.content
                )
            except LockgateError as exc:
                return from_error(exc)
            if isinstance(outcome, Running):
                return JSONResponse({"executionId": execution_id, "status": "running"})
            code = await to_thread.run_sync(self._code, execution_id)
            return JSONResponse(public_view(outcome, code))

        @router.get("/approve/{token}", response_class=HTMLResponse)
        async def page(token: str) -> HTMLResponse:
            try:
                row = await to_thread.run_sync(self.tokens.check, token, None)
            except TokenRefused as exc:
                status = {"used": 410, "expired": 410}.get(exc.reason, 404)
                return HTMLResponse(_notice_page(exc.message), status_code=status)
            try:
                view = await to_thread.run_sync(
                    self.runtime.engine.get, row.execution_id, row.principal_id
                )
            except LockgateError as exc:
                return HTMLResponse(_notice_page(exc.message), status_code=404)
            if view.pending is None or view.pending.seq != row.call_seq:
                return HTMLResponse(
                    _notice_page(f"This request was already settled: it is {view.status}."),
                    status_code=410,
                )
            code = await to_thread.run_sync(self._code, row.execution_id)
            return HTMLResponse(_approval_page(public_view(view, code), token))

        return router


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', '')}"


_STYLE = """
body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;color:#222}
pre{background:#f4f4f4;padding:.75rem;overflow:auto;border-radius:4px}
button{font-size:1rem;padding:.5rem 1.25rem;margin-right:.75rem;border-radius:4px;
  border:1px solid #888}
#approve{background:#1a7f37;color:#fff}#decline{background:#b42318;color:#fff}
dt{font-weight:600;margin-top:.5rem}
"""


def _notice_page(message: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Lockgate approval</title>"
        f"<style>{_STYLE}</style></head><body><h1>Lockgate approval</h1>"
        f"<p id='notice'>{html.escape(message)}</p></body></html>"
    )


def _approval_page(view: dict[str, Any], token: str) -> str:
    esc = html.escape
    args = json.dumps(view["argsPreview"], indent=2)
    # The token and id go into JS as JSON strings: no markup can break out.
    js_data = json.dumps({"token": token, "executionId": view["executionId"]}).replace("</", "<\\/")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Approve {esc(str(view["tool"]))}?</title>
<meta name="referrer" content="no-referrer"><style>{_STYLE}</style></head>
<body>
<h1>Approve a tool call?</h1>
<dl>
<dt>Tool</dt><dd id="tool"><code>{esc(str(view["tool"]))}</code></dd>
<dt>Arguments</dt><dd><pre id="args">{esc(args)}</pre></dd>
<dt>Requested by</dt><dd id="who">{esc(str(view["requestedBy"]))}</dd>
<dt>Expires</dt><dd id="expires">{esc(str(view["expiresAt"]))}</dd>
<dt>Code</dt><dd><pre id="code">{esc(str(view["code"]))}</pre></dd>
</dl>
<p><button id="approve">Approve</button><button id="decline">Decline</button></p>
<p id="outcome" role="status"></p>
<script>
const data = {js_data};
async function decide(action) {{
  for (const b of document.querySelectorAll("button")) b.disabled = true;
  const out = document.getElementById("outcome");
  out.textContent = "Sending…";
  try {{
    const r = await fetch(`/api/executions/${{data.executionId}}/resume`, {{
      method: "POST",
      headers: {{"Content-Type": "application/json", "X-Approval-Token": data.token}},
      body: JSON.stringify({{action}}),
    }});
    const body = await r.json();
    if (!r.ok) {{ out.textContent = body.error.message; return; }}
    out.textContent = action === "accept"
      ? `Approved. The execution is now ${{body.status}}.`
      : `Declined. The execution is now ${{body.status}}.`;
  }} catch (e) {{
    out.textContent = "The server could not be reached; try again.";
    for (const b of document.querySelectorAll("button")) b.disabled = false;
  }}
}}
document.getElementById("approve").addEventListener("click", () => decide("accept"));
document.getElementById("decline").addEventListener("click", () => decide("decline"));
</script>
</body></html>"""
