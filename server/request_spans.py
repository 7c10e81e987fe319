"""A span for each HTTP request, when traces are on (`machine.tracing`).

Hand-written rather than opentelemetry-instrumentation-asgi's middleware: that one names
and describes a span by the request's whole path and query, and here those carry secrets (an
enrolment link's, an OpenID provider's `code` and `state`) and an execution's id in every
approval path. This span is named by the route's first segment (`POST /mcp`,
`GET /approve`), and records the path with its secrets hidden, never the query.

A client that sends a W3C `traceparent` header gets its request's span as a child of its
own: an agent's trace goes on into the server, and into the executions it starts.
"""

from __future__ import annotations

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from lockgate.server.auth import ASGIApp, Message, Receive, Scope, Send
from lockgate.server.operations import hide_path_secrets

_W3C = TraceContextTextMapPropagator()


def span_name(method: str, path: str) -> str:
    """`<METHOD> /<first segment>`: the route family, never an id or a secret."""
    first = path.split("/", 2)[1] if path.startswith("/") else ""
    return f"{method} /{first}"


class RequestSpans:
    """The ASGI middleware: each HTTP request in a SERVER span, current while it is served."""

    def __init__(self, app: ASGIApp, tracer: trace.Tracer) -> None:
        self.app, self.tracer = app, tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", ())
            if k in (b"traceparent", b"tracestate")
        }
        method, path = scope.get("method", "GET"), scope.get("path", "/")
        with self.tracer.start_as_current_span(
            span_name(method, path),
            context=_W3C.extract(headers) if headers else context.Context(),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": hide_path_secrets(path)},
            record_exception=False,  # its message may carry what a span must not
            set_status_on_exception=False,
        ) as span:

            async def observed(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, observed)
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
