"""`lockgate serve` with several worker processes behind one port (`server/workers.py`).

Each worker is an instance of its own (named after its slot: `a#0`, `a#1`), forked by the
process `lockgate serve` started. What a user of such a server notices: a session outlives
every worker that served it; /metrics counts the whole server whichever worker answers; a
worker that dies is replaced, and its replacement recovers its work at once; SIGTERM drains
every worker and exits 0; a SIGKILLed server leaves no worker behind; a configuration no
worker can start with is refused, with no key printed.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.connect import open_engine
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import InstanceStatus
from tests.support.servers import (
    Deployment,
    LockgateServer,
    create_key_directly,
    make_deployment,
    mcp_client,
    new_database_url,
    run,
    structured,
    unique_key,
    write_code,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

#: Long enough that only a replacement under the same name can declare a killed worker
#: dead within a test: its lease would lapse an hour later.
HOUR = "3600"


@pytest.fixture(name="deployment")
def deployment_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    deployment = make_deployment(
        new_database_url(request, "sqlite", tmp_path),
        tmp_path,
        LOCKGATE_WORKERS="2",
        LOCKGATE_LEASE_TTL=HOUR,
        LOCKGATE_HEARTBEAT_INTERVAL="1800",
    )
    try:
        yield deployment
    finally:
        deployment.stop_all()


def workers_of(server: LockgateServer) -> list[int]:
    """The pids of the server's worker processes (its children, by /proc)."""
    path = Path(f"/proc/{server.pid}/task/{server.pid}/children")
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def wait_until(condition: object, what: str, timeout: float = 30.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.05)  # polls the processes or the database; nothing signals it


def instances(deployment: Deployment) -> dict[str, list[str]]:
    """Instance name -> the statuses of its incarnations, oldest first."""
    engine = open_engine(deployment.database_url)
    try:
        rows = sorted(AuditQueries(engine).instances(), key=lambda i: i.started_at)
    finally:
        engine.dispose()
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row.name, []).append(row.status)
    return found


def wait_for_incarnations(deployment: Deployment, *statuses: str) -> None:
    """Wait until both slots' incarnations have these statuses, oldest first (each worker
    declares its slot's last incarnation dead in its own boot recovery, which /readyz, as
    answered by the other worker, does not wait for)."""
    expected = {"a#0": list(statuses), "a#1": list(statuses)}
    wait_until(lambda: instances(deployment) == expected, f"both slots' incarnations {statuses}")


def kill_worker(server: LockgateServer, pid: int) -> None:
    """SIGKILL one worker and wait until its replacement serves (two workers again)."""
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid not in workers_of(server), "the killed worker is reaped")
    wait_until(lambda: len(workers_of(server)) == 2, "a replacement is started")


def test_a_session_outlives_every_worker_that_served_it(deployment: Deployment) -> None:
    server = deployment.start()
    assert "(2 worker processes)" in server.stdout(), server.output()
    first = workers_of(server)
    assert len(first) == 2, first
    assert sorted(instances(deployment)) == ["a#0", "a#1"]
    key = create_key_directly(deployment.database_url, "alice")
    note = unique_key()

    async def scenario() -> dict[str, object]:
        async with mcp_client(server.url, key, "legacy") as client:
            paused = structured(await client.call_tool("execute", {"code": write_code(note)}))
            assert paused["status"] == E.WAITING_FOR_INTERACTION, paused
            # Every worker alive when the session began is killed, one after the other:
            # the session, and the paused execution, are rows any worker serves.
            for pid in first:
                kill_worker(server, pid)
            done = structured(
                await client.call_tool(
                    "resume", {"executionId": paused["executionId"], "action": "accept"}
                )
            )
            return done

    done = run(scenario())
    assert done["status"] == E.COMPLETED, done
    assert done["result"] == {"written": {"key": note, "written": True}}
    assert len(writes_of(deployment, note)) == 1
    assert not set(first) & set(workers_of(server))
    # Each replacement took its slot's name and declared its predecessor dead in its boot
    # recovery, at once (their leases had an hour to go).
    wait_for_incarnations(deployment, InstanceStatus.DEAD, InstanceStatus.LIVE)


def transitions_metric(text: str, machine: str, event: str) -> float:
    pattern = (
        rf'^lockgate_transitions_total\{{(?=[^}}]*machine="{machine}")'
        rf'(?=[^}}]*event="{event}")[^}}]*\}} (\S+)$'
    )
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_metrics_count_every_worker_whichever_answers(deployment: Deployment) -> None:
    server = deployment.start()
    key = create_key_directly(deployment.database_url, "alice")

    async def execute(runs: int) -> None:
        for _ in range(runs):
            async with mcp_client(server.url, key, "legacy") as client:
                done = structured(await client.call_tool("execute", {"code": "1 + 1"}))
                assert done["status"] == E.COMPLETED, done

    run(execute(5))
    # Each worker is replaced, and each replacement commits one transition of its own: it
    # declares its predecessor dead. Whichever worker answers, both are counted, and the
    # executions the dead workers ran too.
    for pid in workers_of(server):
        kill_worker(server, pid)
    wait_for_incarnations(deployment, InstanceStatus.DEAD, InstanceStatus.LIVE)
    for _ in range(20):  # each scrape on a connection of its own: both workers answer some
        text = httpx2.get(f"{server.base_url}/metrics", timeout=10).text
        assert transitions_metric(text, "instance", "declare_dead") == 2, text
        assert transitions_metric(text, "execution", "start") == 5, text


def test_sigterm_drains_every_worker_and_exits_zero(deployment: Deployment) -> None:
    server = deployment.start()
    pids = workers_of(server)
    assert len(pids) == 2
    assert server.terminate(timeout=30) == 0, server.output()
    assert not any(alive(pid) for pid in pids)
    assert instances(deployment) == {
        "a#0": [InstanceStatus.STOPPED],
        "a#1": [InstanceStatus.STOPPED],
    }


def test_a_killed_server_leaves_no_worker_behind(deployment: Deployment) -> None:
    server = deployment.start()
    pids = workers_of(server)
    assert len(pids) == 2
    assert server.kill() == -signal.SIGKILL
    wait_until(lambda: not any(alive(pid) for pid in pids), "the workers die with the server")
    # The port is free again: a restart binds it and recovers both workers' incarnations.
    restarted = deployment.start_at(server.port)
    assert len(workers_of(restarted)) == 2
    wait_for_incarnations(deployment, InstanceStatus.DEAD, InstanceStatus.LIVE)


def test_a_configuration_no_worker_can_start_with_is_refused(
    deployment: Deployment, tmp_path: Path
) -> None:
    sources = tmp_path / "sources.toml"
    sources.write_text('[[openapi]]\nname = "broken"\ndocument = "missing.json"\n')
    server = deployment.spawn(LOCKGATE_SOURCES_FILE=str(sources))
    assert server.wait_exit() == 2, server.output()
    assert "cannot start" in server.stderr()
    assert "missing.json" in server.stderr()
    assert server.printed_keys() == [], "a key was shown for a server that never served"
    assert "Traceback" not in server.stderr()
