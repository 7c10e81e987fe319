"""The Lockgate application: MCP at /mcp, the approval page and API, operations endpoints.

A FastAPI application: the JSON API (the principal's executions, a person's approvals, the
sign-in ceremonies, health, readiness and metrics) is FastAPI's routers, described at
/openapi.json (`server/http_api.py`); the people's HTML pages and /mcp (the MCP SDK's own
ASGI app, described by the protocol) are plain Starlette routes beside them.

Boot order: the runtime registers this incarnation at once, then recovers dead instances'
work in the background; /readyz answers 503 and /mcp asks clients to retry until that
recovery finished, so no request races the recovery of the work it is about. A session's GET
is the exception: it only collects reports (which recover what they describe themselves) or
listens, and a client reconnecting after a restart has few attempts to spend.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator

from anyio import to_thread
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from lockgate.machine import tracing
from lockgate.machine.runtime import Runtime, default_instance_name
from lockgate.machine.settings import Settings
from lockgate.server.approval_access import ApprovalAccess
from lockgate.server.approval_inbox import ApprovalInbox
from lockgate.server.approval_page import ApprovalSurface
from lockgate.server.auth import (
    ASGIApp,
    BearerAuth,
    Receive,
    RequestRate,
    Scope,
    Send,
    header,
    json_rpc_error,
)
from lockgate.server.durable_sessions import DurableSessionManager
from lockgate.server.event_store import ReplayLogs
from lockgate.server.http_api import DESCRIPTION, ApiAuth, LockgateApi, http_exception
from lockgate.server.http_guards import BodyLimit, HostAllowlist, transport_security
from lockgate.server.keys import ApiKeys
from lockgate.server.mcp_server import LockgateMCP
from lockgate.server.operations import (
    Metrics,
    TimedRequests,
    log_transitions,
    operations_router,
)
from lockgate.server.owed_response import DrainSignal
from lockgate.server.person_session import PersonAuth
from lockgate.server.request_spans import RequestSpans
from lockgate.server.runner import ExecutionRunner
from lockgate.server.session_gate import SessionGate
from lockgate.server.session_notices import SessionNotices
from lockgate.server.sign_in_routes import SignInRoutes
from lockgate.server.signing_keys import SigningKeys, signing_keys

log = logging.getLogger("lockgate.server")


class WhenReady:
    """Until boot recovery finished, answer 503 with Retry-After instead of serving; except
    a session's GET, served at once.

    A client whose stream the restart broke reconnects with a GET, only twice, at the
    server's `retry:` interval (the TypeScript and Python SDKs): a 503 spends one of those
    attempts. Such a GET needs no boot recovery to be answered: collecting the session's
    reports takes over what the dead incarnation owed, and its executions, itself
    (`Ledger.lost_reports`); a listening stream needs nothing recovered at all.
    """

    def __init__(self, app: ASGIApp, ready: threading.Event) -> None:
        self.app, self.ready = app, ready

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        early = scope.get("method") == "GET" and header(scope, b"mcp-session-id") is not None
        if scope["type"] == "http" and not self.ready.is_set() and not early:
            await json_rpc_error(
                send,
                503,
                -32002,
                "The server is recovering after a restart; retry in a moment.",
                ((b"retry-after", b"1"),),
            )
            return
        await self.app(scope, receive, send)


ROUTES_HINT = (
    "The MCP endpoint is /mcp; approval pages are /approve/<execution>/<call> and the inbox "
    "/approvals (for people who sign in at /signin); health is /healthz, /readyz and /metrics."
)


#: The methods a 405's Allow header may name.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path: a path's methods may be split
    between routes (the JSON API's GET and POST, a page's GET and its form's POST)."""
    routes = request.app.router.routes

    def served(method: str) -> bool:
        scope = {**request.scope, "method": method}
        return any(route.matches(scope)[0] is Match.FULL for route in routes)

    return [method for method in METHODS if served(method)]


async def no_route(request: Request, exc: Exception) -> Response:
    """An unknown path or method, answered as every other refusal here: a JSON error with a
    code and what to do (Starlette's own answer is a bare text line)."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    path = request.url.path[:200]
    if status == 405:
        allowed = ", ".join(allowed_methods(request))
        return JSONResponse(
            {
                "error": {
                    "code": "method_not_allowed",
                    "message": f"{request.method} is not accepted at {path}; "
                    f"use {allowed or 'another method'}. {ROUTES_HINT}",
                }
            },
            status_code=405,
            headers={"Allow": allowed} if allowed else None,
        )
    return JSONResponse(
        {
            "error": {
                "code": "not_found",
                "message": f"Nothing is served at {path}. {ROUTES_HINT}",
            }
        },
        status_code=404,
    )


def create_app(
    settings: Settings | None = None,
    runtime: Runtime | None = None,
    signing: SigningKeys | None = None,
    *,
    accept_early: bool = True,
) -> LockgateApi:
    """The application; `signing` as `signing_keys(settings)` finds them when not given
    (which refuses PostgreSQL without LOCKGATE_SIGNING_KEYS: `SigningKeysMissing`).

    `accept_early`: the server takes connections while boot recovery runs (answering 503
    until it finished, except a session's GET: `WhenReady`). False for one of several
    workers on one port: it starts accepting once recovered, so the kernel hands a
    connection made meanwhile to a worker that is ready (`server/workers.py`)."""
    settings = settings or Settings()
    # Before the runtime: a server that cannot seal state must not start anything.
    signing = signing or signing_keys(settings)
    # Before the runtime too: traces asked for in a way this server cannot export refuse the
    # start (`TracingMisconfigured`).
    tracing.start_from_environment(default_instance_name(settings))
    runtime = runtime or Runtime.create(settings)
    keys = ApiKeys(runtime.engine.store)
    runner = ExecutionRunner(runtime)
    rate = RequestRate(settings.max_requests_per_minute)
    log.info("state for clients' retries is sealed with %s", signing.origin)
    access = ApprovalAccess(runtime, keys, rate)
    people = PersonAuth(runtime.people, settings)
    approvals = ApprovalSurface(runtime, runner, access, people)
    mcp = LockgateMCP(
        runner, runtime.catalog.book, approvals, settings.max_code_chars, signing.keys
    )
    security = transport_security(settings)
    session_manager = DurableSessionManager(
        mcp.server,
        runtime.sessions,
        ReplayLogs(
            per_session_bytes=settings.sse_replay_bytes_per_session,
            total_bytes=settings.sse_replay_bytes_total,
        ),
        security_settings=security,
        retry_interval=settings.sse_retry_ms,
        # The row is the session; this only bounds how long an idle one stays in memory.
        session_idle_timeout=settings.session_memory_secs,
        max_request_body_size=settings.max_request_bytes,
    )
    drain = DrainSignal()
    ready = threading.Event()
    metrics = Metrics(runtime)
    runtime.engine.write.observers.append(log_transitions)

    def boot() -> None:
        runtime.start(background=True)
        ready.set()
        log.info("ready: boot recovery finished (%s)", runtime.boot_report)

    @contextlib.asynccontextmanager
    async def lifespan(app: LockgateApi) -> AsyncIterator[None]:
        async with session_manager.run():
            threading.Thread(target=boot, name="lockgate-boot", daemon=True).start()
            if not accept_early:  # uvicorn listens once this lifespan has started
                await to_thread.run_sync(ready.wait)
            try:
                yield
            finally:
                # SIGTERM: stop taking work, let running calls finish, record a clean stop.
                drain.trigger()
                await to_thread.run_sync(runtime.drain)
                await to_thread.run_sync(runner.close)
                await to_thread.run_sync(runtime.close)
                # The spans still buffered are exported before the process ends.
                await to_thread.run_sync(tracing.shut_down)

    gate = SessionGate(
        StreamableHTTPASGIApp(session_manager),
        runtime.sessions,
        deadline=settings.response_deadline_secs,
        drain=drain,
        held=session_manager.held,
        replayable=session_manager.replayable,
        max_sessions_per_principal=settings.max_sessions_per_principal,
        notices=SessionNotices(
            store=runtime.engine.store,
            ledger=runtime.sessions.ledger,
            warning=settings.approval_warning,
            clock=lambda: runtime.engine.clock(),
        ),
    )
    mcp_endpoint = WhenReady(
        BearerAuth(gate, keys, rate=rate, recheck_secs=settings.key_recheck_secs), ready
    )
    auth = ApiAuth(access, people)
    inbox = ApprovalInbox(approvals)
    sign_in = SignInRoutes(runtime.people, people)
    app = LockgateApi(
        title="Lockgate",
        description=DESCRIPTION,
        # The document only: an interactive page would load its script from elsewhere, which
        # this server's pages never do (their Content-Security-Policy allows none); any
        # OpenAPI viewer reads /openapi.json.
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        routes=[
            *approvals.pages(),
            *inbox.pages(),
            *sign_in.pages(),
            Route("/mcp", mcp_endpoint, methods=["GET", "POST", "DELETE"]),
        ],
        lifespan=lifespan,
        exception_handlers={404: no_route, 405: no_route, HTTPException: http_exception},
    )
    app.max_calls = settings.max_calls
    keyed = keys if settings.metrics_require_key else None
    app.include_router(operations_router(runtime, metrics, ready, keyed))
    app.include_router(approvals.router(auth))
    app.include_router(inbox.router(auth))
    app.include_router(sign_in.router(auth))
    app.state.runtime = runtime
    app.state.drain = drain
    # Outermost: no route reads more than the body limit, and /mcp, the people's pages and
    # the API answer only to this server's own names, checked before a body is read (a
    # foreign Host is refused as such, whatever it sends). (Starlette runs the middleware
    # added last first.)
    app.add_middleware(
        HostAllowlist,
        security=security,
        prefixes=("/mcp", "/approve", "/api/", "/signin", "/signout", "/enrol/"),
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(TimedRequests, metrics=metrics)
    request_tracer = tracing.tracer()
    if request_tracer is not None:  # outermost: the span covers everything the request does
        app.add_middleware(RequestSpans, tracer=request_tracer)
    return app
