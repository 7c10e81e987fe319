"""The routes a person signs in, enrols a passkey and signs out through.

- `GET /signin`: the sign-in page (the operator's identity provider, a passkey, or both).
- `GET /signin/oidc` and `/signin/oidc/callback`: the OpenID Connect round trip.
- `POST /signin/passkey/options` and `/signin/passkey`: a passkey's ceremony.
- `GET /enrol/{link}`, `POST /enrol/{link}/options` and `/enrol/{link}`: registering a
  passkey with a one-time enrolment link.
- `POST /signout`: the end of the session, on every instance at once.

The pages are plain routes; the JSON the pages' scripts send (the ceremonies, signing out)
is the sign-in part of the HTTP API (`router`), described in /openapi.json. Where the person
goes after signing in (`next`) is a path on this server only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from anyio import to_thread
from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from lockgate.machine.errors import LockgateError
from lockgate.machine.people import EnrolmentRefused, Issued, People, SignedIn
from lockgate.server.approval_answers import NO_STORE, problem
from lockgate.server.http_api import ApiAuth, ProblemRoute, refusals
from lockgate.server.http_models import (
    EnrolledAnswer,
    NoFields,
    PasskeyAnswer,
    PasskeyOptions,
    SignedInAnswer,
    SignedOutAnswer,
)
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


class SignInRoute(ProblemRoute):
    """The sign-in API's own refusals: an enrolment link that cannot be used, a proof that
    proved nothing."""

    def problem_for(self, exc: Exception, request: Request) -> Response:
        if isinstance(exc, EnrolmentRefused):
            status = 404 if exc.reason == "unknown" else 410
            return problem(status, f"enrolment_{exc.reason}", exc.message, exc.hint)
        if isinstance(exc, SignInRefused):
            return problem(401, "sign_in_refused", exc.message, exc.hint)
        return super().problem_for(exc, request)


#: What the ceremonies' answers refuse, besides a bad body.
SIGN_IN_REFUSALS = {
    401: "The proof did not prove who the person is (`sign_in_refused`): unknown passkey, "
    "a challenge answered already or expired, a failed verification.",
    403: "A cross-site request (its Origin is not this server's).",
}
ENROL_REFUSALS = {
    **SIGN_IN_REFUSALS,
    404: "No such enrolment link (`enrolment_unknown`).",
    410: "The enrolment link was used already, or expired (`enrolment_used`, "
    "`enrolment_expired`): ask the operator for a new one.",
}
ANSWER_SHAPE = 'The body must be a JSON object: {"challenge": "...", "credential": {...}}.'
OPTIONS_SHAPE = "The body must be a JSON object (`{}`), or nothing."


class SignInRoutes:
    def __init__(self, people: People, auth: PersonAuth) -> None:
        self.people, self.auth = people, auth
        self.settings = people.settings
        self.passkeys = Passkeys(people)
        self.oidc = OidcSignIn(people)

    def _signed_in(self, issued: Issued, body: dict[str, Any]) -> JSONResponse:
        response = JSONResponse(body, headers=NO_STORE)
        set_session_cookie(response, issued, self.settings, self.people.clock().timestamp())
        return response

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

    async def passkey_options(self) -> Response:
        options = await to_thread.run_sync(self.passkeys.sign_in_options)
        return JSONResponse(options, headers=NO_STORE)

    async def passkey_sign_in(self, body: PasskeyAnswer) -> Response:
        issued = await to_thread.run_sync(
            self.passkeys.sign_in, body.challenge, body.credential
        )
        return self._signed_in(issued, {"signedIn": True})

    async def enrol_options(self, token: str) -> Response:
        options = await to_thread.run_sync(self.passkeys.registration_options, token)
        return JSONResponse(options, headers=NO_STORE)

    async def enrol(self, token: str, body: PasskeyAnswer) -> Response:
        issued = await to_thread.run_sync(
            self.passkeys.register, token, body.challenge, body.credential
        )
        return self._signed_in(issued, {"signedIn": True, "next": DEFAULT_NEXT})

    async def sign_out(self, person: SignedIn) -> Response:
        await to_thread.run_sync(self.people.sign_out, person.session_id)
        response = JSONResponse({"signedOut": True}, headers=NO_STORE)
        clear_session_cookie(response, self.settings)
        return response

    def router(self, auth: ApiAuth) -> APIRouter:
        """The ceremonies' JSON (what the sign-in and enrolment pages' scripts send), and
        signing out. Signing in takes no credential: the answer carries its proof."""
        router = APIRouter(route_class=SignInRoute, tags=["sign-in"])
        cookie = {
            "Set-Cookie": {
                "description": "The person's session cookie (HttpOnly, SameSite=Strict).",
                "schema": {"type": "string"},
            }
        }
        posted = [Depends(auth.posted_by_proof)]
        # The options' (and signing out's) body is `{}`, as the pages send it: documented as
        # required because the request must be sent as JSON (`check_posted`) even when it
        # carries nothing; an empty JSON body is still taken as `{}`.
        json_object = {"requestBody": {"required": True}}

        @router.post(
            "/signin/passkey/options",
            response_model=PasskeyOptions,
            responses=refusals([400, 403, 413, 415, 421, 429], {400: OPTIONS_SHAPE}),
            dependencies=posted,
            openapi_extra=json_object,
            summary="Start signing in with a passkey: the options for the authenticator",
            operation_id="passkeySignInOptions",
        )
        async def passkey_options(_body: NoFields | None = None) -> Response:
            return await self.passkey_options()

        @router.post(
            "/signin/passkey",
            response_model=SignedInAnswer,
            responses={
                200: {"description": "Signed in.", "headers": cookie},
                **refusals(
                    [400, 401, 403, 413, 415, 421], {400: ANSWER_SHAPE, **SIGN_IN_REFUSALS}
                ),
            },
            dependencies=posted,
            summary="Sign in with the authenticator's answer",
            operation_id="passkeySignIn",
        )
        async def passkey_sign_in(body: PasskeyAnswer) -> Response:
            return await self.passkey_sign_in(body)

        @router.post(
            "/signout",
            response_model=SignedOutAnswer,
            responses=refusals([400, 401, 403, 413, 415, 421], {400: OPTIONS_SHAPE}),
            openapi_extra=json_object,
            summary="End the person's session, on every instance",
            operation_id="signOut",
        )
        async def sign_out(
            _body: NoFields | None = None,
            person: SignedIn = Depends(auth.person),
            _posted: None = Depends(auth.posted),
        ) -> Response:
            return await self.sign_out(person)

        @router.post(
            "/enrol/{token}/options",
            response_model=PasskeyOptions,
            responses=refusals(
                [400, 403, 404, 410, 413, 415, 421, 429], {400: OPTIONS_SHAPE, **ENROL_REFUSALS}
            ),
            dependencies=posted,
            openapi_extra=json_object,
            summary="Start registering a passkey with a one-time enrolment link",
            operation_id="enrolOptions",
        )
        async def enrol_options(token: str, _body: NoFields | None = None) -> Response:
            return await self.enrol_options(token)

        @router.post(
            "/enrol/{token}",
            response_model=EnrolledAnswer,
            responses={
                200: {"description": "Registered, and signed in.", "headers": cookie},
                **refusals(
                    [400, 401, 403, 404, 410, 413, 415, 421],
                    {400: ANSWER_SHAPE, **ENROL_REFUSALS},
                ),
            },
            dependencies=posted,
            summary="Register the passkey (the link is used up) and sign in",
            operation_id="enrol",
        )
        async def enrol(token: str, body: PasskeyAnswer) -> Response:
            return await self.enrol(token, body)

        return router

    def pages(self) -> list[Route]:
        """The sign-in, provider round trip and enrolment pages (HTML; not in the API's
        document)."""

        def page(handler: Callable[[Request], Awaitable[Response]]) -> Any:
            async def serve(request: Request) -> Response:
                try:
                    return await handler(request)
                except Exception:
                    log.exception("a sign-in page failed")
                    return failure_notice()

            return serve

        return [
            Route("/signin", page(self.signin_page), methods=["GET"]),
            Route("/signin/oidc", page(self.oidc_start), methods=["GET"]),
            Route("/signin/oidc/callback", page(self.oidc_callback), methods=["GET"]),
            Route("/enrol/{token}", page(self.enrol_page), methods=["GET"]),
        ]
