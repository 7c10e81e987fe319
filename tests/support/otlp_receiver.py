"""A real OTLP/HTTP trace endpoint on loopback, as a collector would listen on port 4318: it
decodes each export with OpenTelemetry's own protobuf messages and keeps every span with the
`service.instance.id` of the process that sent it. A test waits on a condition, never on a
sleep."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.asgi_thread import serve_in_thread


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    instance: str
    attributes: dict[str, str]
    links: tuple[str, ...]


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    async def export(self, request: Request) -> Response:
        batch = ExportTraceServiceRequest.FromString(await request.body())
        received = []
        for resource_spans in batch.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            instance=resource.get("service.instance.id", ""),
                            attributes={
                                a.key: a.value.string_value or str(a.value.int_value)
                                for a in span.attributes
                            },
                            links=tuple(link.span_id.hex() for link in span.links),
                        )
                    )
        with self.changed:
            self.spans.extend(received)
            self.changed.notify_all()
        return Response(
            ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )

    def wait_for(
        self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        with self.changed:
            if not self.changed.wait_for(lambda: condition(self.spans), timeout):
                names = sorted({s.name for s in self.spans})
                raise AssertionError(f"not within {timeout:g} s; spans so far: {names}")
            return list(self.spans)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.changed:
            return [s for s in self.spans if s.name == name]


def serve_otlp(receiver: OtlpReceiver) -> Generator[str]:
    """Serve `receiver` until the generator closes; yields the base URL to give a process as
    OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
    app = Starlette(routes=[Route("/v1/traces", receiver.export, methods=["POST"])])
    for port in serve_in_thread(app, "otlp-receiver"):
        yield f"http://127.0.0.1:{port}"
