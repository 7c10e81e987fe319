"""Every read of live work is planned on the live index (`ix_executions_live`, a partial index
over the non-terminal statuses) or one of its companions for one principal's or one session's
live work (`ix_executions_live_principal`, `ix_executions_live_session`, over the same rows),
on SQLite and PostgreSQL, so its cost grows with live work and never with history. Before
the companions, the admission limits on every `execute` and the session lease's counts read
through the principal's and the session's plain indexes: their whole history.

The statements checked are the ones the code really sends, bound parameters included,
captured from the driver while each read runs (not rebuilt here): SQLite only uses a
partial index when the statement's own text implies the index's condition, which
`status IN (?, ?, ?)` with bound values never does. PostgreSQL's planner is asked with
sequential scans switched off, on a table of a few rows: the question is whether the index
can serve the query, not which plan a tiny table gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.command import downgrade
from sqlalchemy import Engine, event, inspect

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import alembic_config, upgrade
from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

#: Each read of live work, as the code calls it.
READS: dict[str, Callable[[SqlStore], object]] = {
    "recovery's running executions": lambda store: store.executions.running(),
    "the claim loop's pending queue": lambda store: store.executions.pending_ids(50),
    "the expiry sweep's due approvals": lambda store: store.executions.paused_due(NOW),
    "a session's live work": lambda store: store.executions.live_statuses(session_id="s1"),
    "a principal's live work": lambda store: store.executions.live_statuses(principal_id="alice"),
    "a principal's paused count": lambda store: store.executions.paused_count("alice"),
    "the live-executions gauge": lambda store: store.metrics.live_executions_by_status(),
}


@pytest.fixture(name="store")
def store_fixture(database_url: str) -> Iterator[SqlStore]:
    engine = open_engine(database_url)
    upgrade(engine)
    store = SqlStore(engine)
    rows = [
        Execution(
            id=f"e{n}",
            principal_id="alice",
            status=status,
            code="1",
            created_at=NOW,
            updated_at=NOW,
            deadline=NOW - timedelta(minutes=1),
            session_id="s1",
        )
        for n, status in enumerate(
            ["pending", "running", "waiting_for_interaction", "completed", "failed"]
        )
    ]
    with store.session() as s:
        s.add_all(rows)
        s.commit()
    yield store
    engine.dispose()


def sent_while(engine: Engine, read: Callable[[], object]) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []

    def capture(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if "FROM executions" in statement:
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        read()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    return sent


def plan(engine: Engine, statement: str, parameters: Any) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            steps = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")
            steps = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()
        conn.rollback()
    return "\n".join(str(step) for step in steps)


@pytest.mark.parametrize("name", sorted(READS))
def test_each_read_of_live_work_is_planned_on_the_live_index(store: SqlStore, name: str) -> None:
    [(statement, parameters)] = sent_while(store.engine, lambda: READS[name](store))
    assert "ix_executions_live" in plan(store.engine, statement, parameters), statement


def test_migration_0009_goes_both_ways_under_history(store: SqlStore) -> None:
    """Down to 0008 and up again with executions stored: the companions go and come back,
    the rows stay, and the reads are planned on them again."""

    def indexes() -> set[str]:
        with store.engine.connect() as conn:
            return {str(i["name"]) for i in inspect(conn).get_indexes("executions")}

    companions = {"ix_executions_live_principal", "ix_executions_live_session"}
    assert companions <= indexes()
    downgrade(alembic_config(store.engine), "0008")
    assert not companions & indexes()
    upgrade(store.engine)
    assert companions <= indexes()
    assert sorted(store.executions.live_statuses(principal_id="alice")) == [
        "pending",
        "running",
        "waiting_for_interaction",
    ]
    [(statement, parameters)] = sent_while(
        store.engine, lambda: store.executions.paused_count("alice")
    )
    assert "ix_executions_live_principal" in plan(store.engine, statement, parameters)
