"""The routes a person signs in, enrols a passkey and signs out through.

- `GET /signin`: the sign-in page (the operator's identity provider, a passkey, or both).
- `GET /signin/oidc` and `/signin/oidc/callback`: the OpenID Connect round trip.
- `POST /signin/passkey/options` and `/signin/passkey`: a passkey's ceremony.
- `GET /enrol/{link}`, `POST /enrol/{link}/options` and `/enrol/{link}`: registering a
  passkey with a one-time enrolment link.
- `POST /signout`: the end of the session, on every instance at once.

Where the person goes after signing in (`next`) is a path on this server only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from lockgate.machine.errors import LockgateError
from lockgate.machine.people import EnrolmentRefused, Issued, People
from lockgate.server.approval_access import ApprovalAccess
from lockgate.server.approval_answers import NO_STORE, Refusal, from_error, problem, refused
from lockgate.server.pages import expiry_text, failure_notice, notice, render
from lockgate.server.person_session import (
    SIGN_IN_COOKIE,
    PersonAuth,
    clear_session_cookie,
    csrf_token,
    secure,
    set_session_cookie,
)
from lockgate.server.sign_in_oidc import ROUND_TRIP, OidcSignIn
from lockgate.server.sign_in_passkey import Passkeys, SignInRefused

log = logging.getLogger("lockgate.people")

DEFAULT_NEXT = "/approvals"


def safe_next(value: str | None) -> str:
    """A path on this server, never another site (`//host`, `/\\host`, a scheme)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return DEFAULT_NEXT
    if any(c in value for c in "\\\r\n\t") or len(value) > 500:
        return DEFAULT_NEXT
    return value


class SignInRoutes:
    def __init__(self, people: People, auth: PersonAuth, access: ApprovalAccess) -> None:
        self.people, self.auth, self.access = people, auth, access
        self.settings = people.settings
        self.passkeys = Passkeys(people)
        self.oidc = OidcSignIn(people)

    def _signed_in(self, issued: Issued, body: dict[str, Any]) -> JSONResponse:
        response = JSONResponse(body, headers=NO_STORE)
        set_session_cookie(response, issued, self.settings, self.people.clock().timestamp())
        return response

    async def _json_body(self, request: Request) -> dict[str, Any]:
        self.auth.check_posted(request, csrf=False)
        raw = await self.access.read_body(request)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise Refusal(400, "invalid_input", "The body is not JSON.") from None
        if not isinstance(body, dict):
            raise Refusal(400, "invalid_input", "The body must be a JSON object.")
        return body

    # -- pages ----------------------------------------------------------------------------

    async def signin_page(self, request: Request) -> Response:
        next_path = safe_next(request.query_params.get("next"))
        if await self.auth.signed_in(request) is not None:
            return RedirectResponse(next_path, status_code=303)
        return render(
            200,
            "signin.html",
            title="Sign in",
            reason=None,
            oidc=self.oidc.configured,
            oidc_name=self.settings.oidc_provider_name,
            oidc_href=f"/signin/oidc?next={quote(next_path, safe='')}",
            data={"next": next_path},
        )

    async def oidc_start(self, request: Request) -> Response:
        if not self.oidc.configured:
            return notice(
                404,
                "No identity provider is set up here",
                "This server signs people in with passkeys only.",
                "Use a passkey, or ask the operator to set LOCKGATE_OIDC_ISSUER.",
                link=("/signin", "Back to sign-in"),
            )
        try:
            started = await self.oidc.start(safe_next(request.query_params.get("next")))
        except LockgateError as exc:  # the provider, or too many sign-ins at once
            return self._refused_page(exc)
        response = RedirectResponse(started.redirect, status_code=303)
        # Lax: sent on the provider's top-level redirect back, and only to the callback.
        response.set_cookie(
            SIGN_IN_COOKIE,
            started.state,
            max_age=int(ROUND_TRIP.total_seconds()),
            path="/signin/oidc",
            secure=secure(self.settings),
            httponly=True,
            samesite="lax",
        )
        return response

    async def oidc_callback(self, request: Request) -> Response:
        try:
            issued, next_path = await self.oidc.finish(
                dict(request.query_params), request.cookies.get(SIGN_IN_COOKIE)
            )
        except SignInRefused as exc:
            return self._refused_page(exc)
        person = await to_thread.run_sync(self.people.signed_in, issued.token)
        # A page, not a redirect: a cookie set on the provider's cross-site redirect is not
        # sent (SameSite=Strict) until a navigation starts from this site's own page.
        response = render(
            200,
            "signed_in.html",
            title="Signed in",
            next=safe_next(next_path),
            person=person,
            csrf=csrf_token(issued.token),
        )
        set_session_cookie(response, issued, self.settings, self.people.clock().timestamp())
        response.delete_cookie(SIGN_IN_COOKIE, path="/signin/oidc")
        return response

    def _refused_page(self, exc: LockgateError) -> Response:
        return notice(
            401,
            "Sign-in refused",
            exc.message,
            exc.hint or "Start again from the sign-in page.",
            link=("/signin", "Back to sign-in"),
        )

    async def enrol_page(self, request: Request) -> Response:
        token = request.path_params["token"]
        try:
            enrolment, approver = await to_thread.run_sync(self.people.enrolment, token)
        except EnrolmentRefused as exc:
            return notice(
                404 if exc.reason == "unknown" else 410,
                "This enrolment link cannot be used",
                exc.message,
                exc.hint or "",
            )
        principals = await to_thread.run_sync(self.people.principals_of, approver.id)
        return render(
            200,
            "enrol.html",
            title="Create your passkey",
            approver=approver,
            principals="every principal" if principals is None else ", ".join(principals),
            expires_text=expiry_text(enrolment.expires_at),
            data={
                "optionsUrl": f"/enrol/{quote(token)}/options",
                "registerUrl": f"/enrol/{quote(token)}",
            },
        )

    # -- JSON -----------------------------------------------------------------------------

    async def passkey_options(self, request: Request) -> Response:
        await self._json_body(request)
        options = await to_thread.run_sync(self.passkeys.sign_in_options)
        return JSONResponse(options, headers=NO_STORE)

    async def passkey_sign_in(self, request: Request) -> Response:
        body = await self._json_body(request)
        issued = await to_thread.run_sync(
            self.passkeys.sign_in, body.get("challenge"), body.get("credential")
        )
        return self._signed_in(issued, {"signedIn": True})

    async def enrol_options(self, request: Request) -> Response:
        await self._json_body(request)
        token = request.path_params["token"]
        options = await to_thread.run_sync(self.passkeys.registration_options, token)
        return JSONResponse(options, headers=NO_STORE)

    async def enrol(self, request: Request) -> Response:
        body = await self._json_body(request)
        token = request.path_params["token"]
        issued = await to_thread.run_sync(
            self.passkeys.register, token, body.get("challenge"), body.get("credential")
        )
        return self._signed_in(issued, {"signedIn": True, "next": DEFAULT_NEXT})

    async def sign_out(self, request: Request) -> Response:
        person = await self.auth.require(request)
        self.auth.check_posted(request)
        await to_thread.run_sync(self.people.sign_out, person.session_id)
        response = JSONResponse({"signedOut": True}, headers=NO_STORE)
        clear_session_cookie(response, self.settings)
        return response

    def routes(self) -> list[Route]:
        def page(handler: Callable[[Request], Awaitable[Response]]) -> Any:
            async def serve(request: Request) -> Response:
                try:
                    return await handler(request)
                except Exception:
                    log.exception("a sign-in page failed")
                    return failure_notice()

            return serve

        def api(handler: Callable[[Request], Awaitable[Response]]) -> Any:
            async def serve(request: Request) -> Response:
                try:
                    return await handler(request)
                except Refusal as exc:
                    return refused(exc)
                except EnrolmentRefused as exc:
                    status = 404 if exc.reason == "unknown" else 410
                    return problem(status, f"enrolment_{exc.reason}", exc.message, exc.hint)
                except SignInRefused as exc:
                    return problem(401, "sign_in_refused", exc.message, exc.hint)
                except LockgateError as exc:
                    return from_error(exc)
                except Exception:
                    log.exception("a sign-in request failed")
                    return problem(
                        500, "internal_error", "The server failed to handle this request; retry."
                    )

            return serve

        return [
            Route("/signin", page(self.signin_page), methods=["GET"]),
            Route("/signin/oidc", page(self.oidc_start), methods=["GET"]),
            Route("/signin/oidc/callback", page(self.oidc_callback), methods=["GET"]),
            Route("/signin/passkey/options", api(self.passkey_options), methods=["POST"]),
            Route("/signin/passkey", api(self.passkey_sign_in), methods=["POST"]),
            Route("/signout", api(self.sign_out), methods=["POST"]),
            Route("/enrol/{token}", page(self.enrol_page), methods=["GET"]),
            Route("/enrol/{token}/options", api(self.enrol_options), methods=["POST"]),
            Route("/enrol/{token}", api(self.enrol), methods=["POST"]),
        ]
