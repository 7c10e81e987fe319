"""The SQL store and its schema, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, event, update
from sqlmodel import col, select

from lockgate.machine.db.connect import TRANSACTIONS, OpenTransactions, open_engine
from lockgate.machine.db.migrate import (
    DatabaseNotMigrated,
    alembic_config,
    current_revision,
    head_revision,
    prepare_database,
    upgrade,
)
from lockgate.machine.db.schema import Execution, ToolCall, TransitionLog, metadata
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict, IllegalTransition
from lockgate.machine.records import Change
from lockgate.machine.runtime import Runtime
from lockgate.machine.settings import Settings
from tests.support.threads import InThread

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = open_engine(database_url)
    upgrade(engine)
    yield engine
    engine.dispose()


def new_execution(store: SqlStore, execution_id: str = "e1", status: str = "pending") -> None:
    store.commit(
        [],
        [
            Execution(
                id=execution_id,
                principal_id="alice",
                status=status,
                code="1",
                created_at=NOW,
                updated_at=NOW,
            )
        ],
    )


def test_the_migrations_build_exactly_the_declared_schema(engine: Engine) -> None:
    # The code's own head is the scripts' (it is written down so a boot skips Alembic).
    assert head_revision() == ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    assert current_revision(engine) == head_revision()
    upgrade(engine)  # applying again is a no-op
    assert current_revision(engine) == head_revision()


def test_a_transition_is_a_conditional_update_with_an_audit_row(engine: Engine) -> None:
    store = SqlStore(engine)
    new_execution(store)
    store.commit([Change("execution", "e1", "start", "pending", "running", 0, {"owner": "i1"})])
    with store.session() as s:
        row = s.get(Execution, "e1")
        log = list(s.exec(select(TransitionLog)))
    assert row is not None and (row.status, row.version, row.owner) == ("running", 1, "i1")
    assert [(t.event, t.source, t.dest, t.version) for t in log] == [
        ("start", "pending", "running", 1)
    ]


def test_each_commit_s_transitions_share_one_transaction_id_of_their_own(engine: Engine) -> None:
    """The trace check reads which transitions were written together from this id (a
    composition's steps must be, a fenced recovery step must carry its fence); rows with
    none are taken as written before it existed, and skip those checks."""
    store = SqlStore(engine)
    for execution_id in ("e1", "e2", "e3"):
        new_execution(store, execution_id)
    store.commit(
        [
            Change("execution", "e1", "start", "pending", "running", 0, {}),
            Change("execution", "e2", "start", "pending", "running", 0, {}),
        ]
    )
    store.commit([Change("execution", "e3", "start", "pending", "running", 0, {})])
    with store.session() as s:
        log = list(s.exec(select(TransitionLog).order_by(col(TransitionLog.id))))
    assert [t.record_id for t in log] == ["e1", "e2", "e3"]
    together, also, alone = (t.txn for t in log)
    assert isinstance(together, str) and together and isinstance(alone, str) and alone
    assert together == also != alone


def test_a_stale_writer_gets_a_conflict_and_nothing_is_written(engine: Engine) -> None:
    store = SqlStore(engine)
    new_execution(store, "e1")
    new_execution(store, "e2")
    store.commit([Change("execution", "e1", "start", "pending", "running", 0, {})])
    with pytest.raises(Conflict):
        store.commit(
            [
                Change("execution", "e2", "start", "pending", "running", 0, {}),
                Change("execution", "e1", "start", "pending", "running", 0, {}),  # stale
            ]
        )
    with store.session() as s:
        e2 = s.get(Execution, "e2")
        assert e2 is not None and e2.status == "pending"  # rolled back with the other
        assert len(list(s.exec(select(TransitionLog)))) == 1


def test_a_row_inserted_and_moved_in_one_commit_is_stored_as_moved_every_move_logged(
    engine: Engine,
) -> None:
    """As a journaled read is: inserted, then settled, in the commit that carries it (stored
    in its last state, with its insert's values and every change's). A move that does not
    start where the inserted row is refuses the whole commit, as a stale update does."""
    store = SqlStore(engine)
    fresh = Execution(
        id="e1", principal_id="alice", status="pending", code="1", created_at=NOW, updated_at=NOW
    )
    store.commit(
        [
            Change("execution", "e1", "start", "pending", "running", 0, {"owner": "i1"}),
            Change(
                "execution", "e1", "complete", "running", "completed", 1, {"outcome": {"value": 7}}
            ),
        ],
        [fresh],
    )
    with store.session() as s:
        row = s.get(Execution, "e1")
        log = list(s.exec(select(TransitionLog).order_by(col(TransitionLog.id))))
    assert row is not None
    assert (row.status, row.version, row.owner, row.outcome, row.code) == (
        "completed",
        2,
        "i1",
        {"value": 7},
        "1",
    )
    assert row.updated_at > NOW
    assert [(t.event, t.source, t.dest, t.version) for t in log] == [
        ("start", "pending", "running", 1),
        ("complete", "running", "completed", 2),
    ]
    assert len({t.txn for t in log}) == 1

    other = Execution(
        id="e2", principal_id="alice", status="pending", code="2", created_at=NOW, updated_at=NOW
    )
    with pytest.raises(Conflict):
        store.commit(
            [Change("execution", "e2", "complete", "running", "completed", 1, {})], [other]
        )
    with store.session() as s:
        assert s.get(Execution, "e2") is None
        assert len(list(s.exec(select(TransitionLog)))) == 2


def test_the_store_refuses_undeclared_edges_and_non_initial_inserts(engine: Engine) -> None:
    store = SqlStore(engine)
    new_execution(store)
    with pytest.raises(IllegalTransition) as refused:
        store.commit([Change("execution", "e1", "complete", "pending", "completed", 0, {})])
    assert refused.value.message == (
        "execution e1: 'complete' to 'completed' is not a transition the spec declares from "
        "'pending'"
    )
    with pytest.raises(IllegalTransition) as refused:
        new_execution(store, "e2", status="running")
    assert refused.value.message == (
        "execution e2: 'insert' to 'running' is not a transition the spec declares from '(new)'"
    )


def test_sqlite_runs_in_wal_mode_with_full_sync_and_a_busy_timeout(tmp_path: object) -> None:
    engine = open_engine(f"sqlite:///{tmp_path}/x.db")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10000


def test_recovery_reads_live_executions_through_the_live_index(tmp_path: Path) -> None:
    """The query recovery really sends (captured from the driver while `Recovery.orphaned`
    runs, not rebuilt here) is planned on the live index, and finds only the orphans."""
    runtime = Runtime.create(
        Settings(database_url=f"sqlite:///{tmp_path}/x.db", notes_dir=tmp_path / "notes")
    )
    try:
        store = runtime.engine.store
        for execution_id in ("orphan", "mine", "done", "queued"):
            new_execution(store, execution_id)
        start = "start", "pending", "running", 0

        def claim(execution_id: str, owner: str) -> None:
            store.commit([Change("execution", execution_id, *start, {"owner": owner})])

        claim("orphan", "an-instance-with-no-lease")
        claim("mine", runtime.lease.id)
        claim("done", "an-instance-with-no-lease")
        store.commit([Change("execution", "done", "complete", "running", "completed", 1, {})])

        sent: list[tuple[str, Any]] = []

        def capture(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
        ) -> None:
            sent.append((statement, parameters))

        event.listen(store.engine, "before_cursor_execute", capture)
        try:
            orphans = runtime.recovery.orphaned()
        finally:
            event.remove(store.engine, "before_cursor_execute", capture)
        assert [row.id for row in orphans] == ["orphan"]
        [(statement, parameters)] = [
            (statement, parameters) for statement, parameters in sent if "executions" in statement
        ]
        with store.engine.connect() as conn:
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
        details = " ".join(str(step) for step in plan)
        assert "ix_executions_live" in details, (statement, details)
    finally:
        runtime.sandbox.close()
        runtime.engine.store.engine.dispose()


def test_postgres_is_never_migrated_behind_the_operators_back(
    postgres_server: object, request: pytest.FixtureRequest
) -> None:
    from tests.support.postgres import PostgresServer

    assert isinstance(postgres_server, PostgresServer)
    url = postgres_server.url(postgres_server.create_database())
    with pytest.raises(DatabaseNotMigrated, match="lockgate db upgrade"):
        prepare_database(Settings(database_url=url))
    engine = open_engine(url)
    upgrade(engine)
    engine.dispose()
    prepare_database(Settings(database_url=url)).dispose()  # migrated: fine


def test_sqlite_is_migrated_automatically(tmp_path: object) -> None:
    engine = prepare_database(Settings(database_url=f"sqlite:///{tmp_path}/auto.db"))
    assert current_revision(engine) == head_revision()


def test_a_pause_waits_for_the_open_transaction_and_holds_off_new_ones() -> None:
    """The real-process simulation stops a process only while it holds no SQLite
    transaction (a stopped holder would block every other instance on the file)."""
    transactions = OpenTransactions()
    order: list[str] = []
    transactions.enter()

    def begin() -> None:
        transactions.enter()
        order.append("began")

    def pause() -> None:
        with transactions.none_open():
            order.append("paused")
            began.append(InThread(begin))
            order.append("resumed")

    began: list[InThread] = []
    paused = InThread(pause)
    order.append("committed")
    transactions.leave()
    paused.result()
    began[0].result()
    assert order == ["committed", "paused", "resumed", "began"]


def test_the_process_holds_no_transaction_once_a_commit_is_done(engine: Engine) -> None:
    store = SqlStore(engine)
    new_execution(store)
    store.commit([Change("execution", "e1", "start", "pending", "running", 0, {})])

    def pause() -> bool:
        with TRANSACTIONS.none_open():
            return True

    assert InThread(pause).result() is True


def test_instants_are_kept_whatever_the_database_server_s_time_zone(engine: Engine) -> None:
    """PostgreSQL reads a time without a zone in its session's zone: the store hands it aware
    UTC times, so a server set to another zone (here +05:30) stores the same instants."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"ALTER DATABASE \"{engine.url.database}\" SET timezone TO 'Asia/Kolkata'"
            )
        engine.dispose()  # new connections take the database's zone
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW timezone").scalar() == "Asia/Kolkata"
    store = SqlStore(engine)
    new_execution(store)
    with store.session() as s:
        row = s.get(Execution, "e1")
        assert row is not None and row.created_at == NOW


def test_a_read_does_not_wait_for_a_writer_holding_the_write_lock(engine: Engine) -> None:
    """A read is answered from the last committed state while another transaction holds the
    write lock (on SQLite, before it commits and fsyncs): reads never queue behind writes.
    Before, every read began `BEGIN IMMEDIATE` and waited for the lock (up to the busy
    timeout, then failed with "database is locked")."""
    store = SqlStore(engine)
    new_execution(store)
    with engine.connect() as writer:
        writer.execute(
            update(Execution).where(col(Execution.id) == "e1").values(status="running")
        )  # the write lock is held until this block ends, uncommitted
        row = store.executions.get("e1")
        assert row is not None and row.status == "pending"
        assert [r.id for r in store.executions.running()] == []
        writer.commit()
    row = store.executions.get("e1")
    assert row is not None and row.status == "running"


def test_a_view_reads_an_execution_and_its_calls_from_one_moment(engine: Engine) -> None:
    """A call journaled between the view's read of the execution and its read of the calls
    is not shown with that row (on SQLite a read transaction, on PostgreSQL REPEATABLE
    READ); the next view shows it. Each other read is a statement of its own."""
    store = SqlStore(engine)
    new_execution(store)

    def call(seq: int) -> ToolCall:
        return ToolCall(
            id=f"e1:{seq}",
            execution_id="e1",
            seq=seq,
            tool="notes.add",
            status="requested",
            created_at=NOW,
            updated_at=NOW,
        )

    store.commit([], [call(1)])
    journaled: list[str] = []

    def journal_between(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if not journaled and statement.lstrip().startswith("SELECT executions."):
            journaled.append("e1:2")
            InThread(lambda: store.commit([], [call(2)])).result()

    event.listen(engine, "after_cursor_execute", journal_between)
    try:
        seen = store.executions.with_calls("e1")
    finally:
        event.remove(engine, "after_cursor_execute", journal_between)
    assert journaled == ["e1:2"]
    assert seen is not None and [line[0] for line in seen[1]] == [1]
    again = store.executions.with_calls("e1")
    assert again is not None and [line[0] for line in again[1]] == [1, 2]
