"""The approvals inbox: every call waiting for the signed-in principal's decision, newest
first, with what it is (tool, arguments, a code excerpt, who asked, time left), approvable or
declinable from the list; and the decisions made lately (from their audit records).

`GET /api/approvals` answers it as JSON to a Bearer key. `GET /approvals` is the page: the
person gives the key once (kept in the page's memory only, never a cookie), and each
decision goes through the call's own single-use approval link, as on the approval page, so
it is recorded as the page's and decides exactly the call listed.
"""

from __future__ import annotations

import secrets
from typing import Any

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from lockgate.machine.approval_audit import exported
from lockgate.machine.errors import LockgateError
from lockgate.server.approval_answers import NO_STORE, Refusal, from_error, public_view, refused
from lockgate.server.approval_html import document, html_response
from lockgate.server.approval_page import ApprovalSurface

#: The most waiting calls, and decided ones, one answer lists.
LISTED = 100
DECIDED = 20


class ApprovalInbox:
    def __init__(self, approvals: ApprovalSurface) -> None:
        self.approvals = approvals
        self.runtime = approvals.runtime

    def listing(self, principal: str) -> dict[str, Any]:
        """What waits for `principal`'s decision, and what it decided lately."""
        engine = self.runtime.engine
        store = engine.store
        waiting: list[dict[str, Any]] = []
        for execution_id in store.inbox.waiting_ids(principal, LISTED):
            try:
                view = engine.get(execution_id, principal)  # expires it when overdue
            except LockgateError:
                continue
            if view.pending is None:
                continue  # decided or expired since it was listed
            url = self.approvals.approval_url(view)
            row = store.executions.get(execution_id)
            shown = public_view(view, row.code if row is not None else "")
            shown["approvalUrl"] = url
            shown["token"] = url.rsplit("/", 1)[1] if url else None
            waiting.append(shown)
        decided = [
            exported(
                execution_id=call.execution_id,
                principal_id=owner,
                seq=call.seq,
                tool=call.tool,
                decision=call.decision,
                decided_at=call.decided_at,
            )
            for call, owner in store.audit_export.recent(principal, DECIDED)
        ]
        return {"principal": principal, "waiting": waiting, "decided": decided}

    async def _api(self, request: Request) -> Response:
        try:
            if request.headers.get("x-approval-token"):
                raise Refusal(
                    401,
                    "unauthorized",
                    "The inbox lists a principal's approvals: send its API key "
                    "(Authorization: Bearer ...), not an approval link's token.",
                )
            principal = await self.approvals.access.key_principal(request)
            body = await to_thread.run_sync(self.listing, principal)
        except Refusal as exc:
            return refused(exc)
        except LockgateError as exc:
            return from_error(exc)
        return JSONResponse(body, headers=NO_STORE)

    def routes(self) -> list[Route]:
        async def api(request: Request) -> Response:
            return await self._api(request)

        async def page(request: Request) -> Response:
            return inbox_page()

        return [
            Route("/api/approvals", api, methods=["GET"]),
            Route("/approvals", page, methods=["GET"]),
        ]


def inbox_page() -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    body = f"""
<h1>Approvals</h1>
<p class="lead">Calls your agents' code waits on, newest first. Each runs only if you approve
it; declined, the code is told the call was refused.</p>
<form id="signin"><label>API key <input id="key" type="password" autocomplete="off"
 required></label> <button id="open" type="submit">Open</button></form>
<p id="status" role="status" aria-live="polite"></p>
<section id="waiting"></section>
<h2>Decided lately</h2>
<ul id="decided"></ul>
<script nonce="{nonce}">{_SCRIPT}</script>"""
    return html_response(200, document("Approvals", body, nonce), nonce)


_SCRIPT = """
let key = "";
const status = document.getElementById("status");
const waiting = document.getElementById("waiting");
const decided = document.getElementById("decided");
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function left(iso) {
  const ms = Date.parse(iso) - Date.now();
  if (!(ms > 0)) return "expired";
  const mins = Math.floor(ms / 60000);
  return mins >= 60 ? `${Math.floor(mins / 60)} h ${mins % 60} min left` : `${mins} min left`;
}
async function load() {
  status.textContent = "Loading…";
  let r, body;
  try {
    r = await fetch("/api/approvals", {headers: {Authorization: `Bearer ${key}`},
                                       credentials: "omit"});
    body = await r.json();
  } catch (e) {
    status.textContent = "The server could not be reached; try again.";
    return;
  }
  if (!r.ok) {
    status.textContent = body.error.message;
    return;
  }
  status.textContent = `${body.waiting.length} waiting for ${body.principal}.`;
  waiting.replaceChildren();
  for (const item of body.waiting) {
    const card = el("article", undefined, "call");
    card.dataset.execution = item.executionId;
    card.append(el("h3", item.tool, "tool"));
    card.append(el("pre", JSON.stringify(item.argsPreview, null, 2), "args"));
    card.append(el("p", `Asked by ${item.requestedBy} · ${left(item.expiresAt)}`, "muted"));
    card.append(el("pre", item.code, "code"));
    const yes = el("button", "Approve", "approve");
    const no = el("button", "Decline", "decline");
    yes.addEventListener("click", () => decide(item, "accept", card));
    no.addEventListener("click", () => decide(item, "decline", card));
    const actions = el("div", undefined, "actions");
    actions.append(yes, no);
    card.append(actions);
    waiting.append(card);
  }
  decided.replaceChildren();
  for (const d of body.decided) {
    decided.append(el("li", `${d.decidedAt} ${d.action} ${d.tool} (${d.door})`, "past"));
  }
}
async function decide(item, action, card) {
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  const r = await fetch(`/api/executions/${encodeURIComponent(item.executionId)}/resume`, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Approval-Token": item.token},
    body: JSON.stringify({action}),
    credentials: "omit",
  });
  const body = await r.json();
  const verb = action === "accept" ? "Approved" : "Declined";
  const said = r.ok ? `${verb}: the execution is ${body.status}.` : body.error.message;
  status.textContent = said;
  await load();
  status.textContent = said + " " + status.textContent;
}
document.getElementById("signin").addEventListener("submit", (e) => {
  e.preventDefault();
  key = document.getElementById("key").value;
  load();
});
"""
