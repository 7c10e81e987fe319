"""OpenTelemetry spans for what a request and an execution do, across restarts and instances.

Spans: each HTTP request (`server.app`), an execution's first run (`lockgate.execution`),
each tool call (`lockgate.tool_call`), the pause (`lockgate.pause`), the person's or the
model's decision (`lockgate.decision`) and every later run (`lockgate.resume`: after a
decision, or when recovery hands the execution to an instance).

An execution stores the W3C `traceparent` of the span that started it (`trace_parent`):
its decision and every resume are children of that span, whichever instance makes them and
however many restarts later, so one trace shows the whole execution. The request that
carries a decision is linked to it.

Traces are on when an OTLP endpoint is configured with OpenTelemetry's own variables
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, over HTTP/protobuf;
`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*` as usual; `OTEL_SDK_DISABLED`
wins). Off, every helper here returns after one check of a flag: the SDK is not even
imported, and nothing is stored with an execution.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Link, Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

log = logging.getLogger("lockgate.tracing")

#: The variables that name where spans go; without one, traces are off.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_W3C = TraceContextTextMapPropagator()
AttributeValue = str | int | float | bool


class TracingMisconfigured(ValueError):
    """The OpenTelemetry variables ask for something this server cannot export to."""


class _State:
    provider: TracerProvider | None = None
    tracer: trace.Tracer | None = None


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment turns traces on (an endpoint, and the SDK not disabled)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def start_from_environment(instance: str) -> bool:
    """Turn traces on in this process when the environment asks for them (once: a second
    call keeps the first provider). `instance`: this instance's name, the spans'
    `service.instance.id`. TracingMisconfigured for a protocol this server does not speak."""
    if _state.provider is not None or not configured():
        return enabled()
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    if protocol not in ("", "http/protobuf"):
        raise TracingMisconfigured(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported: Lockgate exports "
            "spans over OTLP/HTTP with protobuf. Set it to http/protobuf (a collector "
            "listens for it on port 4318) or unset it."
        )
    # Imported here: a server without traces never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    install(BatchSpanProcessor(OTLPSpanExporter()), instance)
    log.info("traces are exported over OTLP/HTTP")
    return True


def install(processor: SpanProcessor, instance: str) -> TracerProvider:
    """Turn traces on in this process, handing every finished span to `processor` (the OTLP
    exporter's batch, or a test's in-memory exporter)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "lockgate"}
        ).merge(Resource({"service.instance.id": instance}))
    )
    provider.add_span_processor(processor)
    _state.provider, _state.tracer = provider, provider.get_tracer("lockgate")
    return provider


def shut_down() -> None:
    """Export what is still buffered and turn traces off (a clean stop's last step)."""
    provider = _state.provider
    _state.provider = _state.tracer = None
    if provider is not None:
        provider.shutdown()


def tracer() -> trace.Tracer | None:
    """The tracer when traces are on (the HTTP requests' spans are made with it too)."""
    return _state.tracer


def current_parent() -> str | None:
    """The current span's W3C `traceparent`, to store with what it starts; None when
    traces are off or no span is current."""
    if _state.tracer is None:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def span(
    name: str,
    *,
    parent: str | None = None,
    link_current: bool = False,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> Iterator[Span]:
    """A span named `name`, current inside the block: a child of the span whose
    `traceparent` is `parent` when given (an execution's stored one), else of the current
    span. `link_current`: with a `parent`, link the span current here (the request that
    brings a decision) to it. Traces off: nothing but the flag's check."""
    tracer = _state.tracer
    if tracer is None:
        yield INVALID_SPAN
        return
    context = _W3C.extract({"traceparent": parent}) if parent else None
    links = []
    if link_current and parent:
        here = trace.get_current_span().get_span_context()
        if here.is_valid:
            links.append(Link(here))
    kept = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(
        name,
        context=context,
        links=links,
        attributes=kept,
        # An exception's message may carry a secret (a tool's error, a driver's): a span
        # records its type only, as the log does.
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def moment(name: str, attributes: Mapping[str, AttributeValue | None] | None = None) -> None:
    """A span with no duration of its own, under the current one: a point in an
    execution's life (its pause)."""
    if _state.tracer is None:
        return
    with span(name, attributes=attributes):
        pass


def attributes_of(**values: Any) -> dict[str, AttributeValue | None]:
    """`lockgate.`-prefixed span attributes (keyword names, `_` kept)."""
    return {f"lockgate.{key}": value for key, value in values.items()}
