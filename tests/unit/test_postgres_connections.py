"""PostgreSQL connections the store's pool keeps between uses: one the server dropped while
it sat idle (a restart, a failover, an administrator's `pg_terminate_backend`) is found dead
and replaced before it is used, so the next execution does not fail on it. A connection in
steady use is not pinged (a round trip per commit and per read), so a drop within the idle
time shows up once, as the error it is, and the pool starts over."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from lockgate.machine.db import connect
from lockgate.machine.runtime import Runtime
from lockgate.spec import ExecutionStatus

MakeRuntime = Callable[..., Runtime]


def _drop_connections(database_url: str) -> int:
    """Terminate every server process serving the database (as a restart would); how many."""
    url = make_url(connect.normalise_url(database_url))
    admin = url.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin.replace("postgresql+psycopg://", "postgresql://")) as conn:
        dropped = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (url.database,),
        ).fetchone()
    return int(dropped[0]) if dropped else 0


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_an_execution_after_postgresql_dropped_the_idle_connections_runs(
    make_runtime: MakeRuntime, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = make_runtime()
    first = runtime.engine.execute("alice", "1")
    assert first.status is ExecutionStatus.COMPLETED
    assert _drop_connections(database_url) > 0  # the pool's connections, all of them

    # Past the idle time (every pooled connection is, with 0): pinged, found dead, replaced.
    monkeypatch.setattr(connect, "PING_AFTER_IDLE_SECS", 0.0)
    second = runtime.engine.execute("alice", "1 + 1")
    assert (second.status, second.result) == (ExecutionStatus.COMPLETED, 2)

    # Within it, a dropped connection is used as it is: one error, then the pool starts over.
    assert _drop_connections(database_url) > 0
    monkeypatch.setattr(connect, "PING_AFTER_IDLE_SECS", 3600.0)
    with pytest.raises(OperationalError):
        runtime.engine.execute("alice", "3")
    third = runtime.engine.execute("alice", "3")
    assert (third.status, third.result) == (ExecutionStatus.COMPLETED, 3)


def _prepared_statements(runtime: Runtime) -> list[int]:
    """How many statements each of the pool's idle connections has prepared on the server."""
    engine = runtime.engine.store.engine
    held = [engine.connect() for _ in range(engine.pool.checkedin())]  # type: ignore[attr-defined]
    try:
        return [
            int(conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one())
            for conn in held
        ]
    finally:
        for conn in held:
            conn.close()


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_statements_run_again_and_again_stay_prepared_across_views(
    make_runtime: MakeRuntime,
) -> None:
    # psycopg prepares a statement on the server once it has run it 5 times on a connection,
    # and forgets them all when a transaction on it rolls back. Every execution ends with a
    # view (a REPEATABLE READ read of the row and its calls): ended by a rollback, it threw
    # the connection's prepared statements away each time, and the commits' statements were
    # parsed and planned anew at every use.
    runtime = make_runtime()
    for n in range(12):
        view = runtime.engine.execute("alice", f"{n} + 1")
        assert (view.status, view.result) == (ExecutionStatus.COMPLETED, n + 1)
    assert max(_prepared_statements(runtime)) >= 5
