"""The browser pages (approval, inbox, sign-in, enrolment, notices), rendered from the
templates in `server/templates/` with every value escaped (jinja2's autoescape).

Every page carries one stylesheet and one script, both allowed by a per-answer nonce in a
Content-Security-Policy that permits nothing else: no other script, no framing, no form
posts, fetches only to this server. Nothing here is cached, framed, or leaks its URL
through a Referer.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.responses import HTMLResponse

from lockgate.server.approval_answers import NO_STORE

TEMPLATES = Path(__file__).resolve().parent / "templates"

_env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,
)

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


def html_response(status: int, page: str, nonce: str) -> HTMLResponse:
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return HTMLResponse(
        page, status_code=status, headers={**NO_STORE, "Content-Security-Policy": csp}
    )


def render(status: int, template: str, **context: Any) -> HTMLResponse:
    """A page from `template`, its script and style allowed by a fresh nonce."""
    nonce = secrets.token_urlsafe(16)
    context.setdefault("person", None)
    context.setdefault("csrf", "")
    page = _env.get_template(template).render(nonce=nonce, **context)
    return html_response(status, page, nonce)


def expiry_text(when: datetime | None) -> str:
    if when is None:
        return "no deadline"
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def notice(
    status: int,
    title: str,
    message: str,
    hint: str,
    *,
    link: tuple[str, str] | None = None,
    person: Any = None,
    csrf: str = "",
) -> HTMLResponse:
    """A short page that says what happened and what to do (`link`: href, text)."""
    return render(
        status,
        "notice.html",
        title=title,
        message=message,
        hint=hint,
        link={"href": link[0], "text": link[1]} if link else None,
        person=person,
        csrf=csrf,
    )


def settled_notice(status: str, *, person: Any = None, csrf: str = "") -> HTMLResponse:
    """The page's call no longer waits for a decision: it expired, or was decided."""
    if status == "expired":
        return notice(
            410,
            "This request expired",
            "No decision arrived before its deadline, so the tool call was not made.",
            "Ask the agent to run the code again if it is still needed.",
            person=person,
            csrf=csrf,
        )
    return notice(
        410,
        "This request was already decided",
        "The tool call this page was for is no longer waiting for a decision; the execution "
        f"is {_STATUS_WORDS.get(status, status)}.",
        "There is nothing left to do here.",
        link=("/approvals", "Open your approvals"),
        person=person,
        csrf=csrf,
    )


def failure_notice() -> HTMLResponse:
    """A page failed unexpectedly: what went wrong is in the log, not on the page."""
    return notice(
        500,
        "Something went wrong",
        "The server could not show this page.",
        "Reload the page in a moment.",
    )
