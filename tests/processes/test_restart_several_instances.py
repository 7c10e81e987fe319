"""The durable engine across REAL processes, several instances on one PostgreSQL database (f):
a dead instance's work is left alone until its lease lapses, and two instances recovering at
once recover each execution once.

The processes are `python -m tests.support.procs.engine_process`, started and crashed by
`tests.support.engine_processes` as in tests/processes/test_restart_processes.py; on SQLite
(one box) these tests skip.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.engine_processes import LIST_ONCE, Db, Procs, effects_of
from tests.support.polling import wait_for

pytest_plugins = ["tests.support.engine_processes"]

#: The execution is claimed and running; nothing of its code has run yet (its read, made at
#: once, would leave no journal entry before the end anyway).
STARTED = "execution:start:pending->running:after_commit"

pytestmark = pytest.mark.slow

# -- f: several instances on one PostgreSQL database ------------------------------------------


def postgres_only(database_url: str) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("several instances share a PostgreSQL database; SQLite is one box")


def test_a_dead_instance_work_is_left_alone_until_its_lease_lapses(
    procs: Procs, db: Db, database_url: str
) -> None:
    postgres_only(database_url)
    live = procs.start("serve", LOCKGATE_INSTANCE_NAME="b")
    serving = live.read_line()["serving"]

    crashed = procs.crash(
        "execute",
        LIST_ONCE,
        crash_at=STARTED,
        LOCKGATE_INSTANCE_NAME="a",
        LOCKGATE_LEASE_TTL="PT3S",
    )
    dead = db.instance_of(crashed.pid)
    execution_id = db.only_execution().id

    # While the crashed instance's lease holds, the live one (recovering every 0.2 s) must
    # not touch its execution.
    observed = 0
    while True:
        row = db.execution(execution_id)
        if datetime.now(UTC) >= dead.lease_until:
            break  # this read may have come after the lease lapsed: it proves nothing
        assert (row.status, row.owner) == ("running", dead.id)
        observed += 1
        time.sleep(0.05)
    assert observed, "the lease lapsed before the test could look (the machine is too slow)"

    # Once it lapses, the live instance declares it dead and finishes its work.
    wait_for(
        lambda: db.execution(execution_id).status == "completed",
        "the live instance to recover the execution",
    )
    [declared] = db.log(dead.id, "declare_dead")
    [requeued] = db.log(execution_id, "requeue")
    assert declared.at >= dead.lease_until
    assert requeued.at >= dead.lease_until
    assert db.log(execution_id, "interrupt") == []
    assert db.execution(execution_id).outcome == {"result": {"keys": [], "done": True}}
    assert [e["pid"] for e in effects_of(procs, "notes.list")] == [live.pid]
    assert db.instance(serving).status == "live"


def test_two_instances_recovering_at_once_recover_each_execution_once(
    procs: Procs, db: Db, database_url: str, tmp_path: Path
) -> None:
    postgres_only(database_url)
    count = 10
    crashed = procs.crash(
        "execute",
        "--parallel",
        str(count),
        LIST_ONCE,
        crash_at=STARTED,
        LOCKGATE_INSTANCE_NAME="orphans",
    )
    dead = db.instance_of(crashed.pid)
    orphans = {row.id for row in db.executions()}
    assert len(orphans) == count
    for execution_id in orphans:
        assert (db.execution(execution_id).status, db.execution(execution_id).owner) == (
            "running",
            dead.id,
        )
    wait_for(lambda: datetime.now(UTC) > dead.lease_until, "the dead instance's lease to lapse")

    # Both get ready, then both boot (and recover) at the same moment.
    gate = tmp_path / "gate"
    gate.mkdir()
    recoverers = [
        procs.start("recover", LOCKGATE_INSTANCE_NAME=name, ENGINE_PROCESS_GATE=str(gate))
        for name in ("b", "c")
    ]
    wait_for(lambda: len(list(gate.glob("ready-*"))) == 2, "both recoverers to get ready")
    (gate / "go").touch()
    reports = procs.finish(recoverers)

    requeued = [set(report["requeued"]) for report in reports]
    assert requeued[0] | requeued[1] == orphans
    assert requeued[0] & requeued[1] == set(), "an execution was requeued twice"
    assert sum(dead.id in report["declared_dead"] for report in reports) == 1
    for execution_id in orphans:
        events = db.events(execution_id)
        assert events.count("requeue") == 1, events
        assert "interrupt" not in events
        assert events.count("start") == 2, events  # the crashed run, and one after requeue
        assert db.execution(execution_id).status == "completed"
    keys = sorted(e["idempotency_key"] for e in effects_of(procs, "notes.list"))
    assert keys == sorted(f"{execution_id}:1" for execution_id in orphans)
