"""A signed-in person on HTTP: the session cookie, and what a decision request must carry.

The cookie holds `<session id>.<secret>` (`machine/people.py`): HttpOnly (no script reads
it), SameSite=Strict (no other site's page or link sends it), Secure and `__Host-` prefixed
behind https, and no longer-lived than the session itself. An API key never stands in for
it, and nothing an agent was ever given carries it.

A request that decides (or signs out) must also come as JSON, from this server's own page
when the browser names an origin, and carry the CSRF token the page was given: an HMAC of
the cookie's own secret, so it is worth nothing without the cookie and nothing on another
browser. Checked before the body is read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import urlsplit

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import Response

from lockgate.machine.people import Issued, People, SignedIn
from lockgate.machine.settings import Settings
from lockgate.server.approval_answers import Refusal

CSRF_HEADER = "x-csrf-token"
#: The cookie of a sign-in in progress (names its challenge), for the provider's redirect.
SIGN_IN_COOKIE = "lockgate_sign_in"


def cookie_name(settings: Settings) -> str:
    """`__Host-` only where the browser accepts it: on https (it demands Secure)."""
    return "__Host-lockgate_person" if secure(settings) else "lockgate_person"


def secure(settings: Settings) -> bool:
    return settings.base_url.startswith("https://")


def csrf_token(cookie: str) -> str:
    """The token a page sends back with a decision, derived from the session's cookie."""
    digest = hmac.new(cookie.encode(), b"lockgate csrf v1", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def set_session_cookie(
    response: Response, issued: Issued, settings: Settings, now_ts: float
) -> None:
    response.set_cookie(
        cookie_name(settings),
        issued.token,
        max_age=max(1, int(issued.expires_at.timestamp() - now_ts)),
        path="/",
        secure=secure(settings),
        httponly=True,
        samesite="strict",
    )


def clear_session_cookie(response: Response, settings: Settings) -> None:
    response.delete_cookie(
        cookie_name(settings), path="/", secure=secure(settings), httponly=True, samesite="strict"
    )


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class PersonAuth:
    """Who the person on a request is, and the checks on a request that decides."""

    def __init__(self, people: People, settings: Settings) -> None:
        self.people, self.settings = people, settings

    def cookie(self, request: Request) -> str | None:
        return request.cookies.get(cookie_name(self.settings))

    async def signed_in(self, request: Request) -> SignedIn | None:
        cookie = self.cookie(request)
        if not cookie:
            return None
        return await to_thread.run_sync(self.people.signed_in, cookie)

    async def require(self, request: Request) -> SignedIn:
        """The signed-in person, or a 401 that says how to sign in (an API key or an
        approval link is never a person)."""
        person = await self.signed_in(request)
        if person is None:
            raise Refusal(
                401,
                "sign_in_required",
                "Deciding approvals takes a person who signed in: an API key or a link is not one.",
                f"Sign in at {self.settings.base_url}/signin (as an approver the operator "
                "added with `lockgate approvers add`), then try again from the page.",
            )
        return person

    def check_posted(self, request: Request, *, csrf: bool = True) -> None:
        """A state-changing request: JSON, from this server's own page, with the CSRF
        token of the cookie it carries (`csrf`: a request a session must back; a sign-in
        itself is backed by the proof it carries instead)."""
        origin = request.headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self._own_origins(request):
            raise Refusal(403, "forbidden", "Cross-site requests are refused.")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise Refusal(415, "invalid_input", "Send the request as application/json.")
        cookie = self.cookie(request)
        sent = request.headers.get(CSRF_HEADER, "")
        if csrf and not (
            cookie and hmac.compare_digest(sent.encode(), csrf_token(cookie).encode())
        ):
            raise Refusal(
                403,
                "forbidden",
                "The request does not carry this page's CSRF token.",
                "Reload the page and try again from it.",
            )

    def _own_origins(self, request: Request) -> set[str]:
        """The page's own origin: as the request reached us, or as configured publicly
        (behind a TLS-terminating proxy the two differ in scheme)."""
        own = {f"{request.url.scheme}://{request.headers.get('host', '')}".lower()}
        own.add(_origin_of(self.settings.base_url))
        return own
