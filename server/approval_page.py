"""The browser approval: a page at the approval URL and the small REST API behind it.

The approval URL carries a single-use token, `<id>-<mac>`, bound to one paused call and
signed with a server key (`server.approval_tokens`: nothing in the database opens it). The
page's POST sends the token in a custom header with a JSON body, which a cross-site form
cannot do (and a cross-site script cannot without a CORS preflight we never grant); an
Origin header, when present, must be this server's. The API also accepts a principal's Bearer key.

A token decides only the call it was minted for: once that call is settled (or the
execution moved on to another call) the link is refused, even if it was never used. Every
refusal is a JSON problem (API) or a short HTML page (browser), never a stack trace.
"""

from __future__ import annotations

import html
import json
import logging
import secrets
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from machine.db.approval_token_queries import ApprovalTokenUsed
from machine.db.schema import ApprovalToken
from machine.engine import Action
from machine.errors import ErrorCode, LockgateError
from machine.runtime import Runtime
from machine.views import ExecutionView
from server.approval_tokens import USED, ApprovalTokens, TokenRefused
from server.auth import RequestRate, bearer_token, current_key_id
from server.keys import ApiKeys
from server.runner import ExecutionRunner
from server.shapes import Running
from spec import ExecutionStatus as E

log = logging.getLogger("lockgate.approval")

TOKEN_HEADER = "x-approval-token"
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
#: A refused token: used or expired links are gone for good; an unknown (or foreign) one
#: is simply not a credential for this execution.
TOKEN_STATUS: dict[str, int] = {"used": 410, "expired": 410, "unknown": 403, "revoked": 403}

#: Sent with every answer: nothing here may be cached, framed (clickjacking an Approve
#: button) or leak the token-bearing URL through a Referer.
NO_STORE = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class ResumeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline", "cancel"]
    content: JsonValue = None


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


def from_error(exc: LockgateError) -> JSONResponse:
    if isinstance(exc, TokenRefused):
        status = TOKEN_STATUS.get(exc.reason, 403)
        code = "token_" + exc.reason
        return problem(status, code, exc.message, _TOKEN_HINT)
    return problem(STATUS_OF.get(exc.code, 400), str(exc.code), exc.message, exc.hint)


_TOKEN_HINT = (
    "Approval links work once, for one tool call, until it expires. Ask the agent's client "
    "for a new link, or use an API key."
)


def _excerpt(code: str) -> str:
    if len(code) <= CODE_EXCERPT_CHARS:
        return code
    return code[:CODE_EXCERPT_CHARS] + f"\n… ({len(code) - CODE_EXCERPT_CHARS} more characters)"


def public_view(view: ExecutionView, code: str) -> dict[str, Any]:
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


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class ApprovalSurface:
    def __init__(
        self,
        runtime: Runtime,
        runner: ExecutionRunner,
        keys: ApiKeys,
        tokens: ApprovalTokens,
        *,
        rate: RequestRate | None = None,
    ) -> None:
        self.runtime, self.runner, self.keys, self.tokens = runtime, runner, keys, tokens
        #: The same per-principal request budget as /mcp.
        self.rate = rate

    def approval_url(self, view: ExecutionView) -> str | None:
        """The link for the call a paused execution waits on: minted the first time an
        answer shows the call, the same link in every answer after (`ApprovalTokens.link`).
        It expires with the call's deadline, the expiry the page shows."""
        if view.pending is None or view.pending.deadline is None:
            return None
        token = self.tokens.link(
            view.id,
            view.pending.seq,
            view.principal_id,
            view.pending.deadline,
            key_id=current_key_id.get(),
            now=self._now(),
        )
        return f"{self.runtime.settings.base_url}/approve/{token}"

    def _now(self) -> datetime:
        """The runtime's clock: links expire on the same clock as the calls' deadlines."""
        return self.runtime.engine.clock()

    def _check(self, token: str, execution_id: str | None) -> ApprovalToken:
        return self.tokens.check(token, execution_id, now=self._now())

    def _code(self, execution_id: str) -> str:
        row = self.runtime.engine.store.executions.get(execution_id)
        return row.code if row is not None else ""

    def _same_origin(self, request: Request, origin: str) -> bool:
        """The page's own origin: as the request reached us, or as configured publicly
        (behind a TLS-terminating proxy the two differ in scheme)."""
        own = {f"{request.url.scheme}://{request.headers.get('host', '')}".lower()}
        if self.runtime.settings.public_url:
            own.add(_origin_of(self.runtime.settings.public_url))
        return origin.rstrip("/").lower() in own

    async def _authorize(
        self, request: Request, execution_id: str
    ) -> tuple[str, ApprovalToken | None]:
        """Who may act: the approval token's principal (and its row), or the Bearer key's."""
        token = request.headers.get(TOKEN_HEADER)
        if token:
            try:
                row = await to_thread.run_sync(self._check, token, execution_id)
            except TokenRefused as exc:
                raise Refusal(
                    TOKEN_STATUS.get(exc.reason, 403),
                    "token_" + exc.reason,
                    exc.message,
                    _TOKEN_HINT,
                ) from None
            self._admit(row.principal_id)
            return row.principal_id, row
        key = bearer_token(request.scope)
        principal = await to_thread.run_sync(self.keys.authenticate, key) if key else None
        if principal is None:
            raise Refusal(
                401,
                "unauthorized",
                "The API key is not valid (unknown or revoked)."
                if key
                else "Send the approval token (X-Approval-Token) or an API key "
                "(Authorization: Bearer ...).",
                headers={
                    "WWW-Authenticate": 'Bearer realm="lockgate"'
                    + (', error="invalid_token"' if key else "")
                },
            )
        self._admit(principal)
        return principal, None

    def _admit(self, principal: str) -> None:
        wait = self.rate.admit(principal) if self.rate is not None else None
        if wait is not None:
            raise Refusal(
                429,
                "limit_reached",
                "Too many requests for this principal in the last minute (the limit, "
                "LOCKGATE_MAX_REQUESTS_PER_MINUTE).",
                f"Retry in {wait:.0f} s.",
                headers={"Retry-After": str(round(wait))},
            )

    async def _read_body(self, request: Request) -> bytes:
        limit = self.runtime.settings.max_request_bytes
        declared = request.headers.get("content-length", "")
        too_large = Refusal(413, "invalid_input", f"The body is larger than {limit} bytes.")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    def _still_pending(self, row: ApprovalToken) -> None:
        """A token decides the call it was minted for, and no later one."""
        view = self.runtime.engine.get(row.execution_id, row.principal_id)
        if view.pending is not None and view.pending.seq == row.call_seq:
            return
        if view.status == E.EXPIRED:
            raise Refusal(
                410,
                "expired",
                "This request expired before a decision arrived; the tool call was not made.",
                "Ask the agent to run the code again.",
            )
        raise Refusal(
            409,
            "already_settled",
            f"The tool call this link was for is no longer waiting for a decision "
            f"(the execution is {view.status}).",
            "Fetch the execution to see its outcome.",
        )

    async def _get(self, execution_id: str, request: Request) -> Response:
        principal, token_row = await self._authorize(request, execution_id)
        if token_row is not None:
            # A link reads the execution only while its call waits for a decision; after
            # that, what the code did is for the principal's key to see, not the link's.
            await to_thread.run_sync(self._still_pending, token_row)
        view = await to_thread.run_sync(self.runtime.engine.get, execution_id, principal)
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(view, code), headers=NO_STORE)

    async def _resume(self, execution_id: str, request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is not None and not self._same_origin(request, origin):
            raise Refusal(403, "forbidden", "Cross-site requests are refused.")
        if _media_type(request) != "application/json":
            raise Refusal(415, "invalid_input", "Send the decision as application/json.")
        principal, token_row = await self._authorize(request, execution_id)
        try:
            body = ResumeBody.model_validate_json(await self._read_body(request))
        except ValidationError:
            raise Refusal(
                400,
                "invalid_input",
                'The body must be {"action": "accept" | "decline" | "cancel"}.',
            ) from None
        if token_row is None:
            outcome = await self.runner.resume(
                principal, execution_id, Action(body.action), body.content
            )
        else:
            outcome = await self._decide_by_link(
                token_row, request.headers.get(TOKEN_HEADER, ""), body
            )
        if isinstance(outcome, Running):
            return JSONResponse(
                {"executionId": execution_id, "status": "running"}, headers=NO_STORE
            )
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(outcome, code), headers=NO_STORE)

    async def _decide_by_link(
        self, row: ApprovalToken, token: str, body: ResumeBody
    ) -> ExecutionView | Running:
        """Decide the link's call, using the link up in the decision's own transaction:
        a crash before that commits leaves both undone (the link still works), and of two
        clicks only one decides (the other is told the link was used)."""
        try:
            await to_thread.run_sync(self._still_pending, row)
            return await self.runner.resume(
                row.principal_id,
                row.execution_id,
                Action(body.action),
                body.content,
                expected_call=row.call_seq,
                writes=[self.tokens.use(row, now=self._now())],
            )
        except ApprovalTokenUsed:
            raise TokenRefused("used", USED) from None
        except (Refusal, LockgateError):
            # Refused for another reason, e.g. the call was settled meanwhile: if that was
            # another click with this same link, what the approver needs to hear is that
            # the link was used.
            await to_thread.run_sync(self._refuse_if_used, token, row.execution_id)
            raise

    def _refuse_if_used(self, token: str, execution_id: str) -> None:
        try:
            self._check(token, execution_id)
        except TokenRefused as exc:
            if exc.reason == "used":
                raise
        # Any other state of the link leaves the first refusal to stand.

    async def _page(self, token: str) -> HTMLResponse:
        try:
            row = await to_thread.run_sync(self._check, token, None)
        except TokenRefused as exc:
            return _notice(*_TOKEN_NOTICES.get(exc.reason, _TOKEN_NOTICES["unknown"]))
        try:
            view = await to_thread.run_sync(
                self.runtime.engine.get, row.execution_id, row.principal_id
            )
        except LockgateError:
            return _notice(*_TOKEN_NOTICES["unknown"])
        if view.pending is None or view.pending.seq != row.call_seq:
            if view.status == E.EXPIRED:
                return _notice(
                    410,
                    "This request expired",
                    "No decision arrived before its deadline, so the tool call was not made.",
                    "Ask the agent to run the code again if it is still needed.",
                )
            return _notice(
                410,
                "This request was already decided",
                f"The tool call this link was for is no longer waiting for a decision; the "
                f"execution is {_STATUS_WORDS.get(view.status, str(view.status))}.",
                "There is nothing left to do here.",
            )
        code = await to_thread.run_sync(self._code, row.execution_id)
        return _approval_page(public_view(view, code), token)

    def router(self) -> APIRouter:
        router = APIRouter()

        async def answer(work: Awaitable[Response]) -> Response:
            """Every refusal as a JSON problem; anything unexpected logged, never shown."""
            try:
                return await work
            except Refusal as exc:
                return problem(exc.status, exc.code, exc.message, exc.hint, exc.headers)
            except LockgateError as exc:
                return from_error(exc)
            except Exception:
                log.exception("the approval API failed")
                return problem(
                    500, "internal_error", "The server failed to handle this request; retry."
                )

        @router.get("/api/executions/{execution_id}")
        async def get_execution(execution_id: str, request: Request) -> Response:
            return await answer(self._get(execution_id, request))

        @router.post("/api/executions/{execution_id}/resume")
        async def resume(execution_id: str, request: Request) -> Response:
            return await answer(self._resume(execution_id, request))

        @router.get("/approve/{token}", response_class=HTMLResponse)
        async def page(token: str) -> HTMLResponse:
            try:
                return await self._page(token)
            except Exception:
                log.exception("the approval page failed")
                return _notice(
                    500,
                    "Something went wrong",
                    "The server could not show this request.",
                    "Reload the page in a moment.",
                )

        return router


_STATUS_WORDS: dict[str, str] = {
    "completed": "completed",
    "failed": "finished with an error",
    "cancelled": "cancelled",
    "expired": "expired",
    "interrupted": "interrupted by a server restart",
    "running": "running",
    "pending": "about to run",
    "waiting_for_interaction": "waiting for another approval",
}

_TOKEN_NOTICES: dict[str, tuple[int, str, str, str]] = {
    "unknown": (
        404,
        "This approval link is not valid",
        "It may be mistyped or incomplete.",
        "Ask the agent's client for a new link.",
    ),
    "used": (
        410,
        "This approval link was already used",
        "A decision was already sent with it; each link works once.",
        "The agent's client shows the outcome.",
    ),
    "expired": (
        410,
        "This approval link has expired",
        "No decision can be sent with it any more.",
        "Ask the agent's client for a new link if the request is still waiting.",
    ),
    "revoked": (
        403,
        "This approval link no longer works",
        "The API key it was issued under has been revoked.",
        "Ask the agent's client, with a valid key, for a new link.",
    ),
}

_STYLE = """
:root{color-scheme:light;--ok:#1a7f37;--no:#b42318;--line:#d0d7de;--muted:#57606a}
*{box-sizing:border-box}
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;
  background:#f6f8fa;margin:0;padding:2rem 1rem}
main{max-width:48rem;margin:0 auto;background:#fff;border:1px solid var(--line);
  border-radius:8px;padding:1.5rem 2rem}
h1{font-size:1.4rem;margin:0 0 .25rem}
.lead{color:var(--muted);margin:0 0 1.25rem}
.brand{font-size:.8rem;letter-spacing:.08em;text-transform:uppercase;color:var(--muted)}
dl{display:grid;grid-template-columns:9rem 1fr;gap:.6rem 1rem;margin:0 0 1.5rem}
dt{font-weight:600;color:var(--muted)}dd{margin:0;min-width:0}
pre{background:#f6f8fa;border:1px solid var(--line);padding:.75rem;overflow:auto;
  border-radius:6px;margin:0;max-height:24rem;font-size:.875rem}
code{font-size:1rem;font-weight:600}
.actions{display:flex;gap:.75rem}
button{font:inherit;font-weight:600;padding:.55rem 1.5rem;border-radius:6px;
  border:1px solid transparent;color:#fff;cursor:pointer}
button:disabled{opacity:.5;cursor:default}
#approve{background:var(--ok)}#decline{background:var(--no)}
#outcome{margin:1.25rem 0 0;font-weight:600}#outcome:empty{display:none}
#outcome.ok{color:var(--ok)}#outcome.no{color:var(--no)}
#result:empty{display:none}#result{margin-top:.75rem}
.muted{color:var(--muted);font-size:.875rem}
"""


def _document(title: str, body: str, nonce: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        "<meta name='referrer' content='no-referrer'>"
        f"<title>{html.escape(title)} · Lockgate</title>"
        f"<style nonce='{nonce}'>{_STYLE}</style></head>"
        f"<body><main><div class='brand'>Lockgate approval</div>{body}</main></body></html>"
    )


def _html(status: int, document: str, nonce: str) -> HTMLResponse:
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return HTMLResponse(
        document, status_code=status, headers={**NO_STORE, "Content-Security-Policy": csp}
    )


def _notice(status: int, title: str, message: str, hint: str) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    esc = html.escape
    body = (
        f"<h1 id='title'>{esc(title)}</h1><p id='notice'>{esc(message)}</p>"
        f"<p class='muted'>{esc(hint)}</p>"
    )
    return _html(status, _document(title, body, nonce), nonce)


def _json_for_script(value: Any) -> str:
    """JSON that cannot end the <script> element it sits in, whatever the strings hold."""
    text = json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _expiry_text(iso: str | None) -> str:
    if iso is None:
        return "no deadline"
    when = datetime.fromisoformat(iso).astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


_SCRIPT = """
const data = JSON.parse(document.getElementById("data").textContent);
const out = document.getElementById("outcome");
const result = document.getElementById("result");
const buttons = document.querySelectorAll("button");
const words = {
  completed: "The execution completed.",
  failed: "The execution finished with an error",
  cancelled: "The execution was cancelled.",
  running: "The execution is still running; the agent's client will get its result.",
  waiting_for_interaction:
    "The code asked for another approval; the agent's client has the link for it.",
};
const expires = document.getElementById("expires");
const left = Date.parse(expires.getAttribute("datetime")) - Date.now();
if (left > 0) {
  const mins = Math.floor(left / 60000);
  const span = mins >= 60 ? `${Math.floor(mins / 60)} h ${mins % 60} min` : `${mins} min`;
  expires.textContent += ` (in ${span})`;
}
async function decide(action) {
  for (const b of buttons) b.disabled = true;
  out.className = "";
  out.textContent = "Sending…";
  let r, body;
  try {
    r = await fetch(`/api/executions/${encodeURIComponent(data.executionId)}/resume`, {
      method: "POST",
      headers: {"Content-Type": "application/json", "X-Approval-Token": data.token},
      body: JSON.stringify({action}),
      credentials: "omit",
    });
    body = await r.json();
  } catch (e) {
    out.textContent = "The server could not be reached; try again.";
    for (const b of buttons) b.disabled = false;
    return;
  }
  if (!r.ok) {
    out.className = "no";
    out.textContent = body.error.message + (body.error.hint ? " " + body.error.hint : "");
    return;
  }
  const verb = action === "accept" ? "Approved." : "Declined: the call was not made.";
  let said = words[body.status] || `The execution is ${body.status}.`;
  if (body.status === "failed" && body.error) said += `: ${body.error.message}`;
  out.className = action === "accept" ? "ok" : "no";
  out.textContent = `${verb} ${said}`;
  if (body.status === "completed") result.textContent = JSON.stringify(body.result, null, 2);
}
document.getElementById("approve").addEventListener("click", () => decide("accept"));
document.getElementById("decline").addEventListener("click", () => decide("decline"));
"""


def _approval_page(view: dict[str, Any], token: str) -> HTMLResponse:
    esc = html.escape
    nonce = secrets.token_urlsafe(16)
    tool = esc(str(view["tool"]))
    args = json.dumps(view["argsPreview"], indent=2, ensure_ascii=False)
    data = _json_for_script({"token": token, "executionId": view["executionId"]})
    expires: str | None = view["expiresAt"]
    when = esc(_expiry_text(expires))
    body = f"""
<h1>Approve a call to <code id="tool">{tool}</code>?</h1>
<p class="lead">Code run by an agent wants to make this tool call. It runs only if you
approve; if you decline, the code is told the call was refused.</p>
<dl>
<dt>Tool</dt><dd><code>{tool}</code></dd>
<dt>Arguments</dt><dd><pre id="args">{esc(args)}</pre></dd>
<dt>Requested by</dt><dd id="who">{esc(str(view["requestedBy"]))}</dd>
<dt>Expires</dt><dd><time id="expires" datetime="{esc(expires or "")}">{when}</time></dd>
<dt>Code</dt><dd><pre id="code">{esc(str(view["code"]))}</pre></dd>
<dt>Execution</dt><dd class="muted" id="execution">{esc(str(view["executionId"]))}</dd>
</dl>
<div class="actions"><button id="approve" type="button">Approve</button>
<button id="decline" type="button">Decline</button></div>
<p id="outcome" role="status" aria-live="polite"></p>
<pre id="result"></pre>
<script type="application/json" id="data">{data}</script>
<script nonce="{nonce}">{_SCRIPT}</script>"""
    return _html(200, _document(f"Approve {view['tool']}?", body, nonce), nonce)
