"""What an operator sees: health, readiness, Prometheus metrics, JSON logs that never hold a
secret, and a graceful stop on SIGTERM that records the instance as stopped."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session

from machine.db.connect import open_engine
from machine.db.schema import Instance
from tests.conftest import CANARY
from tests.server_fixtures import (
    MODES,
    Deployment,
    LockgateServer,
    SharedServer,
    create_key_directly,
    mcp_client,
    pause,
    run,
    structured,
    unique_key,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.server_fixtures"]

pytestmark = pytest.mark.slow
both_modes = pytest.mark.parametrize("mode", MODES)


#: Agent code that dispatches every notes tool (the secret `notes_token` is resolved for
#: each call), fails one call on purpose and prints.
def busy_code(key: str) -> str:
    return (
        "import tools\n"
        f"tools.notes.write(key={key!r}, text='hello')\n"
        f"note = tools.notes.read(key={key!r})\n"
        "keys = tools.notes.list()\n"
        "try:\n"
        "    tools.notes.read(key='no-such-note-anywhere')\n"
        "    missing = None\n"
        "except Exception as exc:\n"
        "    missing = str(exc)\n"
        "print('read', note)\n"
        f"{{'note': note, 'listed': {key!r} in keys, 'missing': missing}}\n"
    )


async def run_busy_execution(url: str, key: str, mode: str) -> list[str]:
    """Accept the write of `busy_code` and run a failing execution; their ids."""
    note_key = unique_key()
    async with mcp_client(url, key, mode) as client:
        first = await client.call_tool("execute", {"code": busy_code(note_key)})
        execution_id = structured(first)["executionId"]
        done = await client.call_tool("resume", {"executionId": execution_id, "action": "accept"})
        body = structured(done)
        assert body["status"] == "completed", body
        assert body["result"]["note"] == {"key": note_key, "text": "hello"}
        assert body["result"]["listed"] is True
        assert body["result"]["missing"], "the failing read raised inside the code"
        failed = structured(await client.call_tool("execute", {"code": "1 / 0"}))
        assert failed["status"] == "error", failed
    return [execution_id, failed["executionId"]]


def assert_clean_logs(server: LockgateServer) -> list[dict[str, Any]]:
    everything = server.stdout() + server.stderr()
    assert CANARY not in everything, "the secret reached the server's output"
    records = server.log_records()
    assert records, "the server logged nothing"
    for record in records:
        assert {"ts", "level", "logger", "message"} <= set(record), record
        assert CANARY not in str(record)
    return records


# -- health, readiness, metrics ----------------------------------------------------------------


def test_health_and_readiness(shared: SharedServer) -> None:
    with httpx2.Client(timeout=10.0) as http:
        health = http.get(f"{shared.base_url}/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        ready = http.get(f"{shared.base_url}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "instance": shared.server.instance_id}


@both_modes
def test_metrics_after_an_execution(shared: SharedServer, mode: str) -> None:
    async def scenario() -> str:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            await client.call_tool("execute", {"code": "1 + 1"})
            paused = await pause(client, unique_key())
        return str(paused["executionId"])

    execution_id = run(scenario())
    with httpx2.Client(timeout=10.0) as http:
        response = http.get(f"{shared.base_url}/metrics")
    assert response.status_code == 200
    text = response.text
    assert "lockgate_executions" in text and "lockgate_transitions_total" in text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    waiting = samples[("lockgate_executions", (("status", "waiting_for_interaction"),))]
    assert waiting >= 1
    transitions = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "lockgate_transitions_total"
    }
    events = {
        dict(labels)["event"] for labels in transitions if dict(labels)["machine"] == "execution"
    }
    assert "pause" in events, events
    assert all(value >= 1 for value in transitions.values())
    assert any(name.startswith("lockgate_request_seconds") for name, _ in samples)

    async def cancel() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            await client.call_tool("resume", {"executionId": execution_id, "action": "cancel"})

    run(cancel())


# -- logs --------------------------------------------------------------------------------------


@both_modes
def test_logs_are_json_and_never_hold_the_secret(shared: SharedServer, mode: str) -> None:
    run(run_busy_execution(shared.url, shared.alice, mode))
    assert_clean_logs(shared.server)


@both_modes
def test_log_lines_name_their_execution(shared: SharedServer, mode: str) -> None:
    async def scenario() -> str:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            paused = await pause(client, unique_key())
            await client.call_tool(
                "resume", {"executionId": paused["executionId"], "action": "accept"}
            )
        return str(paused["executionId"])

    execution_id = run(scenario())
    # Log lines are written (line-buffered) before the answers they belong to.
    named = [r for r in shared.server.log_records() if r.get("execution_id") == execution_id]
    assert named, "no log line names this execution (started, paused, resumed, completed)"


# -- graceful stop -----------------------------------------------------------------------------


def instance_status(database_url: str, instance_id: str) -> str:
    engine = open_engine(database_url)
    try:
        with Session(engine) as s:
            row = s.get(Instance, instance_id)
            assert row is not None, f"no instance row {instance_id}"
            return row.status
    finally:
        engine.dispose()


def test_sigterm_stops_gracefully(deployment: Deployment) -> None:
    """Work in both eras (dispatching the notes tools with the canary secret), then SIGTERM:
    exit 0 within seconds, the instance row `stopped`, and logs without the secret."""
    key = create_key_directly(deployment.database_url, "alice")
    server = deployment.start(name="graceful")
    assert server.instance_id is not None
    for mode in MODES:
        run(run_busy_execution(server.url, key, mode))
    assert len([e for e in deployment.effects() if e["tool"] == "notes.write"]) == 2

    server.popen.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = server.wait_exit(timeout=10)
    assert time.monotonic() - started < 10
    assert code in (0, -signal.SIGTERM), server.output()
    assert instance_status(deployment.database_url, server.instance_id) == "stopped"
    records = assert_clean_logs(server)
    assert any("shutdown" in r["message"].lower() for r in records), "no shutdown logged"
    assert not any(r["level"] in ("error", "critical") for r in records), [
        r for r in records if r["level"] in ("error", "critical")
    ]
    with httpx2.Client(timeout=2.0) as http:
        assert not _answers(http, server), "the port is still open after the exit"
    assert code == 0


def _answers(http: httpx2.Client, server: LockgateServer) -> bool:
    try:
        http.get(f"{server.base_url}/healthz")
    except httpx2.TransportError:
        return False
    return True
