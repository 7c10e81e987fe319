"""The browser side of an approval: the page at the approval URL and the short notices
shown instead when its link cannot decide anything.

Hand-written HTML with every value escaped, one stylesheet and one script, both allowed by a
per-answer nonce in a Content-Security-Policy that permits nothing else: no other script,
no framing, no form posts, fetches only to this server. The script sends the decision to
the approval API (`server.approval_page`) with the token in a header, never a cookie.
"""

from __future__ import annotations

import html
import json
import secrets
from datetime import UTC, datetime
from typing import Any

from starlette.responses import HTMLResponse

from lockgate.server.approval_answers import NO_STORE
from lockgate.spec import ExecutionStatus as E

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


def document(title: str, body: str, nonce: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        "<meta name='referrer' content='no-referrer'>"
        f"<title>{html.escape(title)} · Lockgate</title>"
        f"<style nonce='{nonce}'>{_STYLE}</style></head>"
        f"<body><main><div class='brand'>Lockgate approval</div>{body}</main></body></html>"
    )


def html_response(status: int, page: str, nonce: str) -> HTMLResponse:
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return HTMLResponse(
        page, status_code=status, headers={**NO_STORE, "Content-Security-Policy": csp}
    )


def _notice(status: int, title: str, message: str, hint: str) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    esc = html.escape
    body = (
        f"<h1 id='title'>{esc(title)}</h1><p id='notice'>{esc(message)}</p>"
        f"<p class='muted'>{esc(hint)}</p>"
    )
    return html_response(status, document(title, body, nonce), nonce)


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
function decision(action) {
  const more = parseInt(document.getElementById("grant").value, 10);
  if (action === "accept" && more > 0) return {action, content: {grant: {calls: more}}};
  return {action};
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
      body: JSON.stringify(decision(action)),
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


def approval_page(view: dict[str, Any], token: str) -> HTMLResponse:
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
<p class="muted"><label>Approve with it the next <input id="grant" type="number" min="0"
max="1000" value="0"> calls of this tool in this execution (for code that calls it in a loop;
each is still recorded).</label></p>
<p id="outcome" role="status" aria-live="polite"></p>
<pre id="result"></pre>
<script type="application/json" id="data">{data}</script>
<script nonce="{nonce}">{_SCRIPT}</script>"""
    return html_response(200, document(f"Approve {view['tool']}?", body, nonce), nonce)


def token_notice(reason: str) -> HTMLResponse:
    """A link that cannot be used (`TokenRefused.reason`); any reason not known here reads
    as an invalid link."""
    return _notice(*_TOKEN_NOTICES.get(reason, _TOKEN_NOTICES["unknown"]))


def settled_notice(status: E) -> HTMLResponse:
    """The link's call no longer waits for a decision: it expired, or was decided."""
    if status == E.EXPIRED:
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
        f"execution is {_STATUS_WORDS.get(status, str(status))}.",
        "There is nothing left to do here.",
    )


def failure_notice() -> HTMLResponse:
    """The page failed unexpectedly: what went wrong is in the log, not on the page."""
    return _notice(
        500,
        "Something went wrong",
        "The server could not show this request.",
        "Reload the page in a moment.",
    )
