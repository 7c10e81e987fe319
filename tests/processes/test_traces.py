"""Traces exported over OTLP/HTTP by real `lockgate serve` processes, to a real OTLP endpoint
on loopback (tests/support/otlp_receiver.py).

An execution started on one instance, which is then SIGKILLed, and decided and resumed on
another: one trace, from the request that started it to the resume, whichever process made
each span. A client's own `traceparent` is continued. Traces asked for over a protocol the
server does not speak refuse the start.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from lockgate.spec import ExecutionStatus as E
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan, serve_otlp
from tests.support.servers import (
    Deployment,
    create_key_directly,
    make_deployment,
    mcp_client,
    new_database_url,
    run,
    structured,
    unique_key,
    write_code,
)

pytest_plugins = ["tests.support.servers"]


@pytest.fixture(name="otlp")
def otlp_fixture() -> Iterator[tuple[OtlpReceiver, str]]:
    receiver = OtlpReceiver()
    serving = serve_otlp(receiver)
    url = next(serving)
    try:
        yield receiver, url
    finally:
        serving.close()


@pytest.fixture(name="traced")
def traced_fixture(
    request: pytest.FixtureRequest, tmp_path: Path, otlp: tuple[OtlpReceiver, str]
) -> Iterator[Deployment]:
    deployment = make_deployment(
        new_database_url(request, "sqlite", tmp_path),
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp[1],
        # Exported within 50 ms of ending: what a SIGKILL would lose is exported before it.
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    try:
        yield deployment
    finally:
        deployment.stop_all()


def only(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, sorted(s.name for s in spans)
    return found[0]


def test_an_execution_is_one_trace_across_a_kill_and_another_instance(
    traced: Deployment, otlp: tuple[OtlpReceiver, str]
) -> None:
    receiver = otlp[0]
    first = traced.start(name="first", LOCKGATE_INSTANCE_NAME="first")
    key = create_key_directly(traced.database_url, "alice")
    note = unique_key()

    async def execute() -> dict[str, Any]:
        async with mcp_client(first.url, key, "legacy") as client:
            return structured(await client.call_tool("execute", {"code": write_code(note)}))

    paused = run(execute())
    assert paused["status"] == E.WAITING_FOR_INTERACTION, paused
    # Everything the first instance made is exported before it is killed: the execution's
    # spans, and the request that started it (which ends once its answer was sent).
    def started_and_paused(spans: list[ReceivedSpan]) -> bool:
        ids = {s.span_id for s in spans}
        runs = [s for s in spans if s.name == "lockgate.execution"]
        return any(s.name == "lockgate.pause" for s in spans) and any(
            r.parent_span_id in ids for r in runs
        )

    receiver.wait_for(started_and_paused)
    first.kill()  # nothing of it is left but the database and what it exported

    second = traced.start(name="second", LOCKGATE_INSTANCE_NAME="second")

    async def resume() -> dict[str, Any]:
        async with mcp_client(second.url, key, "legacy") as client:
            return structured(
                await client.call_tool(
                    "resume", {"executionId": paused["executionId"], "action": "accept"}
                )
            )

    done = run(resume())
    assert done["status"] == E.COMPLETED, done

    def resumed_and_answered(spans: list[ReceivedSpan]) -> bool:
        ids = {s.span_id for s in spans}
        decisions = [s for s in spans if s.name == "lockgate.decision"]
        return any(s.name == "lockgate.resume" for s in spans) and any(
            set(d.links) <= ids for d in decisions
        )

    spans = receiver.wait_for(resumed_and_answered)

    execution = only(spans, "lockgate.execution")
    pause = only(spans, "lockgate.pause")
    decision = only(spans, "lockgate.decision")
    resumed = only(spans, "lockgate.resume")
    started_by = next(s for s in spans if s.span_id == execution.parent_span_id)
    assert (started_by.name, started_by.instance) == ("POST /mcp", "first")
    assert execution.instance == pause.instance == "first"
    assert decision.instance == resumed.instance == "second"
    # One trace: the second instance's spans hang from the first one's request.
    assert {s.trace_id for s in (started_by, execution, pause, decision, resumed)} == {
        started_by.trace_id
    }
    assert decision.parent_span_id == resumed.parent_span_id == started_by.span_id
    assert pause.parent_span_id == execution.span_id
    assert resumed.attributes["lockgate.execution_id"] == paused["executionId"]
    # The request that carried the decision is linked to it.
    [brought_by] = [s for s in spans if s.span_id in decision.links]
    assert (brought_by.name, brought_by.instance) == ("POST /mcp", "second")
    write = next(
        s
        for s in spans
        if s.name == "lockgate.tool_call" and s.attributes["lockgate.tool"] == "notes.write"
    )
    assert (write.parent_span_id, write.instance) == (resumed.span_id, "second")


def test_a_clients_traceparent_is_continued(
    traced: Deployment, otlp: tuple[OtlpReceiver, str]
) -> None:
    server = traced.start()
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    answer = httpx2.get(
        f"{server.base_url}/healthz", headers={"traceparent": f"00-{trace_id}-{parent}-01"}
    )
    assert answer.status_code == 200
    spans = otlp[0].wait_for(lambda spans: any(s.name == "GET /healthz" for s in spans))
    health = only(spans, "GET /healthz")
    assert (health.trace_id, health.parent_span_id) == (trace_id, parent)
    assert health.attributes["http.response.status_code"] == "200"


def test_an_enrolment_secret_never_reaches_a_span(
    traced: Deployment, otlp: tuple[OtlpReceiver, str]
) -> None:
    server = traced.start()
    secret = "s3cr3t-" + secrets.token_hex(8)
    httpx2.get(f"{server.base_url}/enrol/{'0' * 32}.{secret}?code={secret}")
    spans = otlp[0].wait_for(lambda spans: any(s.name == "GET /enrol" for s in spans))
    assert secret not in repr(spans)


def test_traces_over_a_protocol_not_spoken_refuse_the_start(traced: Deployment) -> None:
    server = traced.spawn(OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert server.wait_exit() == 2, server.output()
    assert "http/protobuf" in server.stderr()
    assert "Traceback" not in server.stderr()
    assert server.printed_keys() == []
