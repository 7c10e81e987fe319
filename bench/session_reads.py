"""Case 8: what a 2025 session's request reads before it is served, against the instances
that ever ran.

Every POST of a 2025 session opens with its notices (server/session_notices.py): the
session's lost requests (the ledger, which first declares lost what dead incarnations still
owed it) and its approvals about to expire. Each start of a server is a new incarnation
that stays a row, so a platform restarting daily adds 365 a year: the notices must cost what
the session has unsettled, not what the fleet has lived through.

Measured in process on SQLite, the notices of one session (holding one request owed by this
incarnation, as during a request) against the floor, one indexed read of the session's row
through the same store, at several counts of past incarnations (stopped instance rows,
inserted in bulk).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import Instance
from lockgate.machine.runtime import Runtime
from lockgate.machine.secrets import StaticSecrets
from lockgate.machine.settings import Settings
from lockgate.server.session_notices import SessionNotices
from lockgate.spec import InstanceStatus

PROTOCOL = "2025-06-18"


def seed_incarnations(url: str, count: int) -> None:
    """`count` stopped incarnations of earlier starts, as years of restarts leave them."""
    engine = open_engine(url)
    try:
        upgrade(engine)
        if not count:
            return
        long_ago = datetime.now(UTC) - timedelta(days=365)
        rows = [
            {
                "id": f"past-{n:06d}",
                "name": f"past-{n % 3}",
                "incarnation": n + 1,
                "status": InstanceStatus.STOPPED.value,
                "version": 1,
                "host": "bench",
                "pid": n,
                "started_at": long_ago,
                "lease_until": long_ago,
            }
            for n in range(count)
        ]
        with engine.begin() as conn:
            conn.execute(insert(Instance.__table__), rows)  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def _per_call_us(call: Any, calls: int) -> float:
    for _ in range(calls // 10):  # warm the connection pool and the statement cache
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def measure(folder: Path, past: int, calls: int) -> dict[str, Any]:
    url = f"sqlite:///{folder / 'lockgate.db'}"
    seed_incarnations(url, past)
    settings = Settings(database_url=url, notes_dir=folder / "notes", instance_name="now")
    runtime = Runtime.create(settings, sources=[], secrets=StaticSecrets({}))
    try:
        runtime.start(background=False)
        runtime.sessions.open("s", "alice", PROTOCOL, {"name": "bench", "version": "1"}, {})
        runtime.sessions.ledger.owe("s", 1, "tools/call", None)  # the request being served
        notices = SessionNotices(
            store=runtime.engine.store,
            ledger=runtime.sessions.ledger,
            warning=settings.approval_warning,
            clock=runtime.engine.clock,
        )
        session = runtime.sessions.get("s")
        assert session is not None
        # Read as the request arrives, told as its response starts: both, as a request pays.
        notices_us = _per_call_us(lambda: notices.for_request(session)(), calls)
        floor_us = _per_call_us(lambda: runtime.sessions.get("s"), calls)
    finally:
        runtime.close()
    return {
        "past_incarnations": past,
        "notices_us": round(notices_us),
        "floor_us": round(floor_us),
    }


def session_read_cost(workdir: Path, *, smoke: bool) -> dict[str, Any]:
    sizes, calls = ((0, 10), 100) if smoke else ((0, 100, 1_000, 10_000), 3_000)
    rows = []
    for past in sizes:
        folder = workdir / f"past-{past}"
        folder.mkdir()
        rows.append(measure(folder, past, calls))
    return {"calls": calls, "rows": rows}
