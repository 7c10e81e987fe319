"""Health, readiness, Prometheus metrics and structured logs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Security
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lockgate.machine.records import Change
from lockgate.machine.runtime import Runtime
from lockgate.server.auth import ASGIApp, Message, Receive, Scope, Send, bearer_token
from lockgate.server.http_api import API_KEY, ProblemRoute, answer_head
from lockgate.server.http_models import Health, Readiness
from lockgate.server.keys import ApiKeys

#: What of a request's path is a secret: an enrolment link's (`/enrol/<id>.<secret>`), and
#: the code and state an OpenID provider sends back.
_PATH_SECRETS = (
    (re.compile(r"(/enrol/[0-9a-f]{32})\.[A-Za-z0-9_-]+"), r"\1.…"),
    (re.compile(r"([?&](?:code|state)=)[^&\s\"]+"), r"\1…"),
)


def hide_path_secrets(text: str) -> str:
    for pattern, replacement in _PATH_SECRETS:
        text = pattern.sub(replacement, text)
    return text


#: Set around request handling so every log line names what it is about.
log_execution_id: ContextVar[str | None] = ContextVar("log_execution_id", default=None)
log_session_id: ContextVar[str | None] = ContextVar("log_session_id", default=None)


def _message(record: logging.LogRecord) -> str:
    # An enrolment link, or a sign-in's code, is a credential: no log line carries one.
    return hide_path_secrets(record.getMessage())


def _ids(record: logging.LogRecord) -> dict[str, str]:
    """The execution and session a line is about: given with the call, or from the request."""
    ids: dict[str, str] = {}
    for key, var in (("execution_id", log_execution_id), ("session_id", log_session_id)):
        value = getattr(record, key, None) or var.get()
        if value:
            ids[key] = str(value)
    return ids


def _exception(record: logging.LogRecord) -> str | None:
    # The exception type only: messages and stacks may carry data we must not log.
    if record.exc_info and record.exc_info[0] is not None:
        return record.exc_info[0].__name__
    return None


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, execution and session ids."""

    def format(self, record: logging.LogRecord) -> str:
        # UTC to the millisecond: lines from several instances sort into one timeline.
        when = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, Any] = {
            "ts": f"{when:%Y-%m-%dT%H:%M:%S}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _message(record),
            **_ids(record),
        }
        if record.exc_info:
            entry["exception"] = _exception(record)
        return json.dumps(entry)


class TextLogFormatter(logging.Formatter):
    """A readable line for a person at a terminal, with what the JSON line says: local time,
    level, logger, message, then the ids and the exception type in brackets. Redacted the same
    way, and one line per record (a newline in a message is escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created)
        extras = [f"{key}={value}" for key, value in _ids(record).items()]
        exception = _exception(record)
        if exception:
            extras.append(f"exception={exception}")
        message = _message(record).replace("\n", "\\n")
        suffix = f" [{' '.join(extras)}]" if extras else ""
        return (
            f"{when:%Y-%m-%d %H:%M:%S}.{int(record.msecs):03d} {record.levelname:<8} "
            f"{record.name}: {message}{suffix}"
        )


LogFormat = Literal["text", "json"]


def configure_logging(log_format: LogFormat = "json", level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(TextLogFormatter() if log_format == "text" else JsonLogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx2 logs every outbound request's URL at info, httpcore2 each step at debug: a URL
    # may carry a credential (a source's `auth = {query = ...}`), so they speak of nothing
    # below a warning, whatever the level.
    for chatty in ("httpx2", "httpcore2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


class LiveExecutions(Collector):
    """Executions by live status, read through the live index at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "lockgate_executions", "Live executions by status", labels=["status"]
        )
        live = self.runtime.engine.store.metrics.live_executions_by_status()
        counts = {row.status: row.count for row in live}
        for status in ("pending", "running", "waiting_for_interaction"):
            gauge.add_metric([status], counts.get(status, 0))
        yield gauge


#: Where prometheus-client's multiprocess mode keeps each process's counts.
SHARED_METRICS = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def shared_metrics() -> Iterator[str]:
    """A folder where several workers' metrics meet, so that /metrics, whichever worker
    answers it, counts the whole server: the operator's PROMETHEUS_MULTIPROC_DIR when set,
    else a fresh folder removed afterwards."""
    given = os.environ.get(SHARED_METRICS)
    if given:
        yield given
        return
    folder = tempfile.mkdtemp(prefix="lockgate-metrics-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def use_shared_metrics(folder: str) -> None:
    """In a worker, before its metrics exist: count into `folder` (prometheus-client picks
    its value class once, at import, from this variable; a worker forked after the import
    picks it again)."""
    os.environ[SHARED_METRICS] = folder
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


class Metrics:
    """The transition counts and request latencies, and the live executions (read from the
    database at scrape time). Several workers share their counts through the folder
    `shared_metrics` made: each scrape sums every worker's, dead ones' included (a counter
    never goes back)."""

    def __init__(self, runtime: Runtime) -> None:
        self.registry = CollectorRegistry()
        shared = bool(os.environ.get(SHARED_METRICS))
        if shared:
            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
        # Shared, the counts live in the folder: registered here too, they would be counted
        # twice (this worker's own, then everyone's).
        own = None if shared else self.registry
        self.transitions = Counter(
            "lockgate_transitions",
            "Committed lifecycle transitions by machine and event (pause, resume, expire, "
            "requeue/interrupt = recoveries, ...)",
            ["machine", "event"],
            registry=own,
        )
        self.latency = Histogram(
            "lockgate_request_seconds",
            "HTTP request latency",
            ["route"],
            registry=own,
        )
        self.registry.register(LiveExecutions(runtime))
        runtime.engine.write.observers.append(self.observe)

    def observe(self, changes: tuple[Change, ...]) -> None:
        for change in changes:
            self.transitions.labels(change.machine, change.event).inc()


transitions_log = logging.getLogger("lockgate.transitions")

#: Renewals and per-request bookkeeping, logged at debug: at info a heartbeat every few
#: seconds and three lines per request would drown the transitions an operator looks for.
#: The transition log table and /metrics still count every one of them.
ROUTINE_TRANSITIONS = frozenset(
    {
        ("instance", "heartbeat"),
        ("session", "begin_request"),
        ("session", "end_request"),
        ("owed_request", "answer"),
    }
)


def log_transitions(changes: tuple[Change, ...]) -> None:
    """One log line per committed transition, naming its execution (statuses only)."""
    for change in changes:
        if change.machine in ("execution", "tool_call"):
            execution_id = change.record_id.split(":")[0]
        else:
            execution_id = None
        routine = (change.machine, change.event) in ROUTINE_TRANSITIONS
        transitions_log.log(
            logging.DEBUG if routine else logging.INFO,
            "%s %s: %s %s -> %s",
            change.machine,
            change.record_id,
            change.event,
            change.source,
            change.dest,
            extra={"execution_id": execution_id} if execution_id else {},
        )


METRICS_KEY = "This server asks for an API key at /metrics (LOCKGATE_METRICS_REQUIRE_KEY)."
#: Prometheus's text exposition format, as `generate_latest` writes it.
PROMETHEUS = "text/plain; version=0.0.4"


PROBLEM = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


class PrometheusText(Response):
    media_type = PROMETHEUS


def operations_router(
    runtime: Runtime, metrics: Metrics, ready: Any, keys: ApiKeys | None = None
) -> APIRouter:
    """Health, readiness and metrics (the operator's part of the HTTP API: administration is
    the command line); `keys` given, /metrics wants a valid API key."""
    router = APIRouter(route_class=ProblemRoute, tags=["operations"])

    @router.get(
        "/healthz",
        response_model=Health,
        summary="The process answers",
        operation_id="health",
    )
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @router.get(
        "/readyz",
        response_model=Readiness,
        responses={
            503: {
                "model": Readiness,
                "description": "Not ready: boot recovery is running (`recovering`), or "
                "another instance took this one's work over (`fenced`).",
            }
        },
        summary="Boot recovery finished and this instance serves",
        operation_id="readiness",
    )
    async def readyz() -> Response:
        if not ready.is_set():
            return JSONResponse({"status": "recovering"}, status_code=503)
        if runtime.fenced.is_set():
            return JSONResponse({"status": "fenced"}, status_code=503)
        return JSONResponse({"status": "ready", "instance": runtime.lease.id})

    @router.get(
        "/metrics",
        response_class=PrometheusText,
        responses={
            200: {
                "content": {PROMETHEUS: {"schema": {"type": "string"}}},
                "description": "Prometheus's text format.",
            },
            # The refusal is JSON, not the route's text (which a `model` here would claim).
            **({401: {"description": METRICS_KEY, "content": PROBLEM}} if keys is not None else {}),
        },
        # The key is asked for only where the operator said so: the document says what this
        # server does.
        dependencies=[Security(API_KEY)] if keys is not None else [],
        summary="Prometheus metrics",
        operation_id="metrics",
    )
    def prometheus(request: Request) -> Response:
        # Not async: checking the key reads the database (FastAPI runs it on a thread).
        if keys is not None:
            token = bearer_token(request.scope)
            if token is None or keys.authenticate(token) is None:
                return JSONResponse(
                    {
                        "error": {
                            "code": "unauthorized",
                            "message": "/metrics needs an API key here "
                            "(LOCKGATE_METRICS_REQUIRE_KEY): send Authorization: Bearer <key>.",
                        }
                    },
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="lockgate"'},
                )
        return PrometheusText(generate_latest(metrics.registry))

    return answer_head(router)


class TimedRequests:
    """Observes each HTTP request's latency, by route, until its response starts.

    A plain ASGI middleware: starlette's `BaseHTTPMiddleware` (`@app.middleware("http")`)
    runs the app in a task of its own and copies every response body through a memory
    stream, a cost every MCP request paid for one histogram observation."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                path = getattr(route, "path", None) or (
                    "/mcp" if scope.get("path") == "/mcp" else "other"
                )
                self.metrics.latency.labels(path).observe(time.perf_counter() - start)
            await send(message)

        await self.app(scope, receive, observed)
