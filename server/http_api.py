"""The HTTP API on FastAPI: its credentials as security schemes, its refusals, and the
document at `/openapi.json`.

- **Credentials.** A principal's API key (`Authorization: Bearer`) and a person's session
  cookie, plus the CSRF header on what a person changes, are FastAPI security schemes: each
  route names what it takes, and the document says so. The schemes only describe; the
  checks themselves stay where they were, in `ApprovalAccess` (the key, its rate, the old
  link header) and `PersonAuth` (the cookie, the origin, the media type, the CSRF token),
  run as the routes' dependencies in the order they always ran.
- **Refusals.** Every refusal is `{"error": {"code", "message", "hint"?}}`: what a handler
  raises (`Refusal`, a `LockgateError`), a body FastAPI could not validate (a 400
  `invalid_input` whose message is the one the route documents for its 400, never FastAPI's
  422), and anything unexpected (logged, answered as a 500 that shows nothing of it).
- **The document.** FastAPI writes it from the routes, once, at the first request for it
  (not at boot); `LockgateApi.openapi` adds the package's version and states each
  operation's credentials as one requirement (FastAPI lists a route's schemes as
  alternatives; here a route needs all of them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Security
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, APIRouter
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from lockgate.machine.errors import LockgateError
from lockgate.machine.people import SignedIn
from lockgate.server.approval_access import ApprovalAccess
from lockgate.server.approval_answers import Refusal, from_error, problem, refused
from lockgate.server.http_models import Problem
from lockgate.server.person_session import PersonAuth, cookie_name

log = logging.getLogger("lockgate.http")

#: A principal's API key, as /mcp takes it.
API_KEY = HTTPBearer(
    scheme_name="apiKey",
    bearerFormat="lg_...",
    description="A principal's API key (`lockgate keys create <principal>`): the agent's "
    "credential. It reads its own executions and gives up its own calls.",
    auto_error=False,
)
#: The token a person's page sends with what it changes (an HMAC of the session cookie).
CSRF = APIKeyHeader(
    name="X-CSRF-Token",
    scheme_name="csrfToken",
    description="The CSRF token the signed-in person's page was given (worth nothing without "
    "the session cookie it was derived from). Sent with every request that changes something; "
    "such a request must also be `application/json` and, when the browser names an Origin, "
    "come from this server's own.",
    auto_error=False,
)

#: What a refusal with each status means, where the route says nothing more specific.
REFUSED: dict[int, str] = {
    400: "The request is not valid: the message says what to send.",
    401: "No valid credential for this route: the message says which one it takes.",
    403: "The credential does not allow this (another person's principal, a cross-site "
    "request, a missing CSRF token, an accept that takes a person).",
    404: "No such execution or call for this credential (another principal's is answered "
    "exactly like a missing one).",
    409: "The call was decided already, or changed since it was shown; or the execution was "
    "interrupted.",
    410: "The call expired before it was decided.",
    413: "The body is larger than this server's limit (LOCKGATE_MAX_REQUEST_BYTES).",
    415: "The body must be sent as `application/json`.",
    421: "The Host header is not one this server answers to (LOCKGATE_PUBLIC_URL, "
    "LOCKGATE_ALLOWED_HOSTS).",
    429: "Too many requests for this principal (LOCKGATE_MAX_REQUESTS_PER_MINUTE), or too many "
    "sign-ins at once: retry later.",
}
#: The code a refusal FastAPI or Starlette raised gets, by status.
CODE_OF: dict[int, str] = {
    400: "invalid_input",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "invalid_input",
    415: "invalid_input",
    429: "limit_reached",
}


def refusals(
    statuses: Iterable[int], said: Mapping[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each status with the refusal model and what it means
    there (`said`, or the general meaning). A route's 400 description is also the message
    its invalid bodies get (`ProblemRoute`)."""
    said = said or {}
    return {
        status: {"model": Problem, "description": said.get(status, REFUSED[status])}
        for status in statuses
    }


def http_problem(exc: HTTPException) -> Response:
    """A refusal Starlette or FastAPI raised (not a route's own), in the product's shape."""
    status = exc.status_code
    return problem(status, CODE_OF.get(status, "invalid_input"), str(exc.detail)[:500])


async def http_exception(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return http_problem(exc)


def _where(error: Mapping[str, Any]) -> str:
    """One validation error in a few words: where (in the body), and what is wrong."""
    if error.get("type") == "json_invalid":
        return "the body is not JSON"
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    where = ".".join(location)
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", ""))


class ProblemRoute(APIRoute):
    """A route whose every refusal is a JSON problem: raised as `Refusal` or `LockgateError`
    by its dependencies or its handler, or a body FastAPI refused."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def answered(request: Request) -> Response:
            try:
                return await handle(request)
            except Exception as exc:
                return self.problem_for(exc, request)

        return answered

    def problem_for(self, exc: Exception, request: Request) -> Response:
        """The answer to what a request raised; a subclass answers its own kinds first."""
        if isinstance(exc, Refusal):
            return refused(exc)
        if isinstance(exc, RequestValidationError):
            return self.invalid(exc)
        if isinstance(exc, LockgateError):
            return from_error(exc)
        if isinstance(exc, HTTPException):
            return http_problem(exc)
        # The log's formatters keep only the exception's type (its message may carry data).
        log.error("%s %s failed", request.method, self.path, exc_info=exc)
        return problem(500, "internal_error", "The server failed to handle this request; retry.")

    def invalid(self, exc: RequestValidationError) -> Response:
        expected = str(self.responses.get(400, {}).get("description") or REFUSED[400])
        found = "; ".join(_where(error) for error in exc.errors()[:3])
        return problem(400, "invalid_input", f"{expected} ({found})" if found else expected)


def answer_head(router: APIRouter) -> APIRouter:
    """HEAD on every GET route, as Starlette's own routes answer it (a load balancer's health
    check may send HEAD), left out of the document: it is the GET without its body."""
    for route in list(router.routes):
        if isinstance(route, APIRoute) and "GET" in (route.methods or ()):
            router.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                responses=route.responses,
                include_in_schema=False,
                route_class_override=type(route),
            )
    return router


class ApiAuth:
    """The routes' credentials, as dependencies: each runs the existing check, and declares
    the security scheme the document names for it."""

    #: The principal of the request's API key (or the refusal: missing, unknown, over rate).
    principal: Callable[..., Awaitable[str]]
    #: The signed-in person (or the refusal: no session, an old link's header).
    person: Callable[..., Awaitable[SignedIn]]
    #: A person's change: same origin, JSON, with the session's CSRF token.
    posted: Callable[..., None]
    #: A sign-in's request: same origin and JSON (the proof it carries backs it, not a token).
    posted_by_proof: Callable[..., None]
    #: The principal's change: JSON.
    json_only: Callable[..., None]

    def __init__(self, access: ApprovalAccess, people: PersonAuth) -> None:
        session = APIKeyCookie(
            name=cookie_name(people.settings),
            scheme_name="personSession",
            description="A signed-in person's session (OpenID Connect or a passkey, at /signin): "
            "HttpOnly, SameSite=Strict. Only an approver decides calls, and only for the "
            "principals they were granted.",
            auto_error=False,
        )

        async def principal(
            request: Request, _key: HTTPAuthorizationCredentials | None = Security(API_KEY)
        ) -> str:
            return await access.key_principal(request)

        async def person(request: Request, _cookie: str | None = Security(session)) -> SignedIn:
            access.refuse_link_tokens(request)
            return await people.require(request)

        def posted(request: Request, _token: str | None = Security(CSRF)) -> None:
            people.check_posted(request)

        def posted_by_proof(request: Request) -> None:
            people.check_posted(request, csrf=False)

        def json_only(request: Request) -> None:
            access.check_json(request)

        self.principal, self.person, self.posted = principal, person, posted
        self.posted_by_proof, self.json_only = posted_by_proof, json_only


def package_version() -> str:
    # Read when the document is first asked for, not at boot (it scans the installed
    # distributions).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lockgate")
    except PackageNotFoundError:
        return "0+unknown"


DESCRIPTION = """\
Lockgate's HTTP API beside its MCP endpoint (`/mcp`, described by the MCP protocol, not
here): a principal's own executions with its API key, the calls a signed-in person
approves, the sign-in and enrolment ceremonies, and the operator's health, readiness and
metrics (the only administration over HTTP: the rest is the `lockgate` command line).

Every refusal is `{"error": {"code": "<stable code>", "message": "...", "hint": "..."}}`.
"""


class LockgateApi(FastAPI):
    """The application: FastAPI, whose document states each operation's credentials, and
    this server's own bounds where a request's schema depends on them."""

    #: LOCKGATE_MAX_CALLS: the most calls a grant may cover.
    max_calls: int | None = None

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.version = package_version()
            document = super().openapi()
            for item in document.get("paths", {}).values():
                for operation in item.values():
                    # FastAPI's own 422 is never answered here: a body it cannot validate
                    # gets the route's documented 400 (`ProblemRoute.invalid`).
                    operation.get("responses", {}).pop("422", None)
                    # All of a route's schemes at once (one requirement), or none at all:
                    # an operation without credentials says so rather than inheriting.
                    needs: dict[str, list[str]] = {}
                    for requirement in operation.get("security", []):
                        needs.update(requirement)
                    operation["security"] = [needs] if needs else []
            schemas = document.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            calls = schemas.get("CallsGrant", {}).get("properties", {}).get("calls")
            if calls is not None and self.max_calls is not None:
                calls["maximum"] = self.max_calls
        return self.openapi_schema or {}
