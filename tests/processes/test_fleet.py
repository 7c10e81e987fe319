"""A fleet: three `lockgate serve` instances on one real PostgreSQL, behind a round-robin
proxy without session affinity (every request of a session goes to the next instance).
Several clients (the Python SDK, one session each) execute writes that pause for approval
and accept them, while one instance is SIGKILLed under that load. Its sessions keep working
on the others, its work is recovered by another instance once its lease lapses, and nothing
is lost or done twice: every write accepted by a completed execution was made exactly once,
and no execution is left behind.

The kill must find work in flight on the instance it kills, every time: in one round each
execution, after its write, calls `tools.hold.until_open()` (tests/support/hold_plugin.py),
which names the instance running it and returns only once the test opens the gate. The
instance killed is one holding such a call; the gate opens after the kill."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.connect import open_engine
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import InstanceStatus
from tests.support.hold_plugin import entered, open_gate
from tests.support.round_robin import RunningProxy, serve_proxy
from tests.support.servers import (
    Deployment,
    LockgateServer,
    create_key_directly,
    make_deployment,
    mcp_client,
    new_database_url,
    run,
    structured,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

CLIENTS = 6
ROUNDS = 4
#: The round whose executions hold a call in flight until the test, having killed an
#: instance running one, opens the gate (the rounds before it move sessions around first).
HOLD_ROUND = 1
#: Attempts a client makes at one step before the test gives up on it.
ATTEMPTS = 6


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(name="gate")
def gate_fixture(tmp_path: Path) -> Path:
    gate = tmp_path / "gate"
    gate.mkdir()
    return gate


@pytest.fixture(name="instances")
def instances_fixture(
    request: pytest.FixtureRequest, tmp_path: Path, gate: Path
) -> Iterator[Deployment]:
    sources = tmp_path / "sources.toml"
    sources.write_text(
        '[[python]]\nfactory = "tests.support.hold_plugin:make_source"\n'
        f"options = {{ directory = {json.dumps(str(gate))} }}\n"
    )
    deployment = make_deployment(
        new_database_url(request, "postgres", tmp_path),
        tmp_path,
        PYTHONPATH=str(ROOT),  # the servers import the hold source from tests.support
        LOCKGATE_SOURCES_FILE=str(sources),
        LOCKGATE_LEASE_TTL="1",
        LOCKGATE_HEARTBEAT_INTERVAL="0.2",
        # A broken stream is retried soon (the SDKs wait the server's `retry:` first).
        LOCKGATE_SSE_RETRY_MS="200",
        # Every client is one principal, and in the held round all their executions run at
        # once on whichever instances (the dead one's until its lease lapses): the
        # per-principal running limit is what this test is not about.
        LOCKGATE_MAX_RUNNING_PER_PRINCIPAL=str(2 * CLIENTS),
        # The product's default: one worker process per core behind each server's port, each
        # an instance of its own (`fleet-<n>#<slot>`).
        LOCKGATE_WORKERS="0",
    )
    try:
        yield deployment
    finally:
        deployment.stop_all()


def a_write(note: str, hold: bool) -> str:
    """A write that needs approval, then (when `hold`) a call held until the gate opens: an
    execution killed while holding it is recovered from its checkpoint after the write,
    which is not made again."""
    held = "tools.hold.until_open()\n" if hold else ""
    return f"written = tools.notes.write(key={note!r}, text='v')\n{held}{{'written': written}}\n"


class Worker:
    """One client: one session through the proxy, as long as it works; a new one when the
    SDK gives up on it. Each step is retried as a client would: an execute with its
    idempotency key (attaching to the execution an earlier attempt started), a resume with
    the same decision (the same outcome again)."""

    def __init__(self, url: str, key: str, name: str, done: list[int]) -> None:
        self.url, self.key, self.name, self.done = url, key, name, done
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.failures: list[str] = []

    async def step(self, client: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return structured(await client.call_tool(tool, arguments))

    async def run(self) -> None:
        for round_ in range(ROUNDS):
            note = f"{self.name}-{round_}"
            call = {"code": a_write(note, round_ == HOLD_ROUND), "idempotencyKey": note}
            outcome: dict[str, Any] | None = None
            for _ in range(ATTEMPTS):
                try:
                    async with mcp_client(self.url, self.key, "legacy") as client:
                        paused = await self.step(client, "execute", call)
                        if paused["status"] == "waiting_for_interaction":
                            paused = await self.step(
                                client,
                                "resume",
                                {"executionId": paused["executionId"], "action": "accept"},
                            )
                        while paused["status"] in ("running", "pending"):
                            paused = await self.step(
                                client, "resume", {"executionId": paused["executionId"]}
                            )
                        outcome = paused
                        break
                except Exception as exc:  # a stream cut by the kill: try again
                    self.failures.append(f"{note}: {type(exc).__name__}: {exc}")
            assert outcome is not None, f"{note} never settled: {self.failures}"
            self.outcomes[note] = outcome
            self.done.append(1)


def running_on(database_url: str, instance: str) -> set[str]:
    """The executions the instance named `instance` runs now (by the database)."""
    engine = open_engine(database_url)
    try:
        audit = AuditQueries(engine)
        ids = {i.id for i in audit.instances() if i.name == instance}
        return {e.id for e in audit.executions() if e.status == E.RUNNING and e.owner in ids}
    finally:
        engine.dispose()


def test_a_fleet_loses_nothing_when_an_instance_is_killed_under_load(
    instances: Deployment, gate: Path
) -> None:
    fleet = instances
    servers: list[LockgateServer] = [
        fleet.start(name=f"instance-{n}", LOCKGATE_INSTANCE_NAME=f"fleet-{n}") for n in range(3)
    ]
    key = create_key_directly(fleet.database_url, "alice")
    proxies = serve_proxy([s.base_url for s in servers])
    proxy: RunningProxy = next(proxies)
    try:
        done: list[int] = []
        workers = [Worker(proxy.url, key, f"w{n}", done) for n in range(CLIENTS)]

        async def load() -> tuple[str, set[str]]:
            tasks = [asyncio.create_task(w.run()) for w in workers]
            while not entered(gate):
                await asyncio.sleep(0.05)  # polls the workers' progress, nothing else
            # Killed while it holds a call in flight: that work must be recovered elsewhere.
            victim = entered(gate)[0]
            server = servers[int(victim.removeprefix("fleet-").split("#")[0])]
            assert await asyncio.to_thread(server.kill) == -signal.SIGKILL
            in_flight = await asyncio.to_thread(running_on, fleet.database_url, victim)
            assert in_flight, f"{victim} was killed holding a call, yet ran nothing"
            open_gate(gate)
            await asyncio.gather(*tasks)
            return victim, in_flight

        victim, in_flight = run(load())
    finally:
        proxies.close()

    # Every instance served requests: sessions really moved between them.
    assert all(proxy.proxy.served[s.base_url] > 0 for s in servers), proxy.proxy.served
    outcomes = {note: o for w in workers for note, o in w.outcomes.items()}
    assert len(outcomes) == CLIENTS * ROUNDS
    for note, outcome in outcomes.items():
        writes = writes_of(fleet, note)
        if outcome["status"] == E.COMPLETED:
            assert outcome["result"] == {"written": {"key": note, "written": True}}
            assert len(writes) == 1, (note, writes)
        else:
            # Cut off mid-write by the kill: reported as interrupted (an error named
            # `execution_interrupted`, the execution's own status `interrupted`), never made
            # twice.
            assert outcome["status"] == "execution_interrupted", outcome
            assert outcome["executionStatus"] == E.INTERRUPTED, outcome
            assert len(writes) <= 1, (note, writes)
    completed = [o for o in outcomes.values() if o["status"] == E.COMPLETED]
    assert len(completed) >= CLIENTS * ROUNDS - 1, outcomes

    engine = open_engine(fleet.database_url)
    try:
        audit = AuditQueries(engine)
        stranded = [
            e.id for e in audit.executions() if e.status not in (E.COMPLETED, E.INTERRUPTED)
        ]
        assert stranded == []
        recovered = {
            t.record_id for t in audit.transitions() if t.event in ("requeue", "interrupt")
        }
        assert in_flight <= recovered, "the killed instance's work was not recovered by another"
        statuses = {i.name: i.status for i in audit.instances()}
        assert statuses.get(victim) == InstanceStatus.DEAD, statuses
    finally:
        engine.dispose()
