"""What an operator sees: health, readiness, Prometheus metrics, JSON logs that never hold a
secret, and a graceful stop on SIGTERM that records the instance as stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Instance
from lockgate.machine.secrets import REDACTED, environment_variable
from lockgate.simulation.canary import LEAKING_CODE, TOKEN_SECRET
from lockgate.simulation.ports import free_port
from tests.support.canary import CANARY
from tests.support.servers import (
    DATABASES,
    MODES,
    Deployment,
    LockgateServer,
    SharedServer,
    create_key_directly,
    make_deployment,
    mcp_client,
    new_database_url,
    pause,
    run,
    structured,
    unique_key,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow
both_modes = pytest.mark.parametrize("mode", MODES)


#: Agent code that dispatches every notes tool, fails one call on purpose and prints.
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


# -- a server whose tools leak their secret ----------------------------------------------------
#
# The notes tools never put their token in what they return, so "the secret is nowhere" holds
# for them whether or not the engine scrubs anything. The canary tools (simulation/canary.py)
# echo the same secret in a result, quote it in an error and raise it in an unexpected
# exception: only the engine's scrubbing keeps it out of the answers, the logs and the rows.

ROOT = Path(__file__).resolve().parents[2]
CANARY_SERVER = "tests.support.procs.canary_server"


def spawn_canary_server(deployment: Deployment, name: str) -> LockgateServer:
    """`lockgate serve` (the same serve path, through tests/support/procs/canary_server.py) with the
    canary source registered and its secret set; stopped with the deployment."""
    port = free_port()
    stdout_path = deployment.logs_dir / f"{name}.stdout"
    stderr_path = deployment.logs_dir / f"{name}.stderr"
    env = deployment.env({environment_variable(TOKEN_SECRET): CANARY, "PYTHONPATH": str(ROOT)})
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        popen = subprocess.Popen(
            [sys.executable, "-m", CANARY_SERVER, "--port", str(port)],
            cwd=deployment.logs_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    server = LockgateServer(name, port, popen, stdout_path, stderr_path)
    deployment.servers.append(server)
    server.wait_ready()
    return server


async def run_leaking_execution(url: str, key: str, mode: str) -> dict[str, Any]:
    """Run `LEAKING_CODE` (every canary tool, auto-approved) and check what the client got:
    the tools ran and leaked, and every leak was scrubbed. The completed answer."""
    async with mcp_client(url, key, mode) as client:
        result = await client.call_tool("execute", {"code": LEAKING_CODE})
    body = structured(result)
    assert not result.is_error, body
    assert body["status"] == "completed", body
    echoed, rejected, exploded = body["result"]
    # The result, the error message and the printed logs held the token: scrubbed.
    assert echoed == {
        "token": REDACTED,
        "said": f"authenticated with {REDACTED}",
        "nested": [{"t": REDACTED}],
    }, echoed
    reason = f"upstream rejected the token {REDACTED} (HTTP 401)"
    assert rejected == f"tools.canary.reject failed: {reason}", rejected
    # The unexpected exception's text is never kept: only its type.
    assert exploded == "tools.canary.explode failed: the tool failed unexpectedly (ValueError)"
    assert REDACTED in body["logs"], body
    answer = json.dumps(body) + "\n".join(
        block.text for block in result.content if block.type == "text"
    )
    assert CANARY not in answer, "the secret reached the client"
    return body


def assert_no_secret_in_the_database(database_url: str) -> None:
    """Every row of every table, snapshots included (bytes searched as latin-1)."""
    engine = open_engine(database_url)
    try:
        dump = "\n".join(text for _, text in AuditQueries(engine).stored_text())
    finally:
        engine.dispose()
    assert REDACTED in dump, "the leaking calls' scrubbed results are not in the database"
    assert CANARY not in dump, "the secret reached the database"


@dataclass
class CanaryServer:
    deployment: Deployment
    server: LockgateServer
    key: str


@pytest.fixture(name="canary", scope="module", params=DATABASES)
def canary_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CanaryServer]:
    """One server with the canary source per database kind, shared by this module's tests."""
    kind: str = request.param
    directory = tmp_path_factory.mktemp(f"canary-{kind}")
    deployment = make_deployment(
        new_database_url(request, kind, directory),
        directory,
        LOCKGATE_INSTANCE_NAME=f"canary-{uuid.uuid4().hex[:6]}",
    )
    try:
        key = create_key_directly(deployment.database_url, "alice")
        yield CanaryServer(deployment, spawn_canary_server(deployment, "canary"), key)
    finally:
        deployment.stop_all()


# -- health, readiness, metrics ----------------------------------------------------------------


def test_health_and_readiness(shared: SharedServer) -> None:
    with httpx2.Client(timeout=10.0) as http:
        health = http.get(f"{shared.base_url}/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        ready = http.get(f"{shared.base_url}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "instance": shared.server.instance_id}


def test_an_unknown_path_or_method_is_a_json_error_that_names_the_routes(
    shared: SharedServer,
) -> None:
    with httpx2.Client(timeout=10.0) as http:
        missing = http.get(f"{shared.base_url}/mpc")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert missing.json()["error"]["message"].startswith("Nothing is served at /mpc.")
        assert "The MCP endpoint is /mcp" in missing.json()["error"]["message"]
        wrong = http.put(f"{shared.base_url}/mcp")
        assert wrong.status_code == 405
        allowed = wrong.headers["allow"]  # Starlette lists them in no fixed order
        assert set(allowed.split(", ")) == {"GET", "HEAD", "POST", "DELETE"}
        assert wrong.json()["error"] == {
            "code": "method_not_allowed",
            "message": f"PUT is not accepted at /mcp; use {allowed}. The MCP endpoint is /mcp; "
            "approval pages are /approve/<execution>/<call> and the inbox /approvals (for "
            "people who sign in at /signin); health is /healthz, /readyz and /metrics.",
        }


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
    # Every request is timed under its route: the MCP calls made above among them.
    assert samples[("lockgate_request_seconds_count", (("route", "/mcp"),))] >= 2

    async def cancel() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            await client.call_tool("resume", {"executionId": execution_id, "action": "cancel"})

    run(cancel())


# -- logs --------------------------------------------------------------------------------------


@both_modes
def test_logs_are_json_and_never_hold_the_secret(canary: CanaryServer, mode: str) -> None:
    """The canary tools leak their secret everywhere they can; none of it reaches the logs
    (the unexpected exception is logged by its type only), the answers or the rows."""
    run(run_busy_execution(canary.server.url, canary.key, mode))
    run(run_leaking_execution(canary.server.url, canary.key, mode))
    records = assert_clean_logs(canary.server)
    assert any("tool canary.explode raised ValueError" in r["message"] for r in records), (
        "the unexpected exception was not logged (by its type)"
    )
    assert_no_secret_in_the_database(canary.deployment.database_url)


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
    """Work in both eras (the notes tools, and the canary tools that leak their secret),
    then SIGTERM: exit 0 within seconds, the instance row `stopped`, and logs (to the last
    line, written while draining) and rows without the secret."""
    key = create_key_directly(deployment.database_url, "alice")
    server = spawn_canary_server(deployment, "graceful")
    assert server.instance_id is not None
    for mode in MODES:
        run(run_busy_execution(server.url, key, mode))
        run(run_leaking_execution(server.url, key, mode))
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
    assert_no_secret_in_the_database(deployment.database_url)


def _answers(http: httpx2.Client, server: LockgateServer) -> bool:
    try:
        http.get(f"{server.base_url}/healthz")
    except httpx2.TransportError:
        return False
    return True
