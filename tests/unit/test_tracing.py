"""Traces of an execution, in process, with the SDK's in-memory exporter (`machine.tracing`).

One execution is one trace, whatever happens between its pause and its decision: here a
restart (a new runtime on the same database; the real process restart, over OTLP, is in
tests/processes/test_traces.py). With traces off nothing is stored and no span is made.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from lockgate.machine import tracing
from lockgate.machine.engine import Action
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import WRITE_THEN_READ, MakeRuntime, restart, row_of


@pytest.fixture(name="spans")
def spans_fixture() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter), "test-instance")
    try:
        yield exporter
    finally:
        tracing.shut_down()


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def one(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [s.name for s in spans.get_finished_spans()]
    return found[0]


def test_an_execution_is_one_trace_across_a_restart(
    make_runtime: MakeRuntime, spans: InMemorySpanExporter
) -> None:
    with tracing.span("client.execute") as asked:
        paused = make_runtime().engine.execute("alice", WRITE_THEN_READ)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    runtime = restart(make_runtime)  # nothing of the first incarnation is kept
    with tracing.span("client.resume") as decided:
        done = runtime.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED

    trace_id = asked.get_span_context().trace_id
    request = asked.get_span_context().span_id
    execution = one(spans, "lockgate.execution")
    pause = one(spans, "lockgate.pause")
    decision = one(spans, "lockgate.decision")
    resume = one(spans, "lockgate.resume")
    calls = named(spans, "lockgate.tool_call")
    for span in (execution, pause, decision, resume, *calls):
        assert span.context is not None and span.context.trace_id == trace_id, span.name
    # The execution, its decision and its resume hang from the request that started it.
    assert execution.parent is not None and execution.parent.span_id == request
    assert decision.parent is not None and decision.parent.span_id == request
    assert resume.parent is not None and resume.parent.span_id == request
    assert pause.parent is not None and pause.parent.span_id == execution.context.span_id
    # The request that brought the decision is a trace of its own, linked to it.
    assert decided.get_span_context().trace_id != trace_id
    assert [link.context.span_id for link in decision.links] == [
        decided.get_span_context().span_id
    ]
    assert decision.attributes is not None
    assert decision.attributes["lockgate.action"] == "accept"
    assert decision.attributes["lockgate.tool"] == "notes.write"
    assert resume.attributes is not None
    assert resume.attributes["lockgate.resumed_after"] == "decision"
    # Both calls ran after the decision, inside the resume.
    assert sorted(str((c.attributes or {})["lockgate.tool"]) for c in calls) == [
        "notes.read",
        "notes.write",
    ]
    assert all(c.parent is not None and c.parent.span_id == resume.context.span_id for c in calls)


def test_traces_off_store_nothing_and_make_no_span(make_runtime: MakeRuntime) -> None:
    assert not tracing.enabled()
    with tracing.span("client.execute") as outside:
        paused = make_runtime().engine.execute("alice", WRITE_THEN_READ)
    assert not outside.get_span_context().is_valid
    assert row_of(make_runtime(), paused.id).trace_parent is None


def test_an_error_inside_a_span_is_named_by_its_type_only(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), tracing.span("lockgate.tool_call"):
        raise RuntimeError("token=s3cr3t")
    failed = one(spans, "lockgate.tool_call")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "RuntimeError"
    assert "s3cr3t" not in str(failed.to_json())
