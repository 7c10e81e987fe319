"""The commit path's statements sent to SQLite's driver directly
(`machine.db.driver_statements`): what they store is byte for byte what SQLAlchemy would
have stored, and the database's refusals reach callers as SQLAlchemy's errors; and the rows
they insert, made without the ORM's instrumentation (`new_row`), hold what their
constructors would."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, event, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session as SqlSession
from sqlmodel import SQLModel

from lockgate.machine.db import driver_statements
from lockgate.machine.db.driver_statements import driver_statement
from lockgate.machine.db.queries import new_row
from lockgate.machine.db.schema import Execution, OwedRequest, Session, ToolCall
from lockgate.machine.db.store import SqlStore
from lockgate.machine.records import Change
from tests.support.sqlite_store import sqlite_store

NAMES = ("id", "idempotency_key")
AT = datetime(2026, 12, 7, 22, 46, 4, 41982, tzinfo=UTC)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return tmp_path / "lockgate.db"


@pytest.fixture
def store(database: Path) -> Iterator[SqlStore]:
    with sqlite_store(database) as store:
        yield store


def execution(execution_id: str) -> Execution:
    """A row with a value in every kind of column the commit path writes."""
    return Execution(
        id=execution_id,
        principal_id="principal-1",
        session_id="session-1",
        origin_request='session-1:"req-7"',
        idempotency_key=f"again-{execution_id}",  # unique per principal
        status="pending",
        owner="instance-1",
        code="print('héllo')\n",
        direct_tool=None,
        snapshot=b"\x00\x01sealed\xff",
        runtime_version="1.4.0",
        calls_made=2,
        snapshot_call=2,
        deadline=AT + timedelta(hours=1),
        logs="a line\n",
        outcome=None,
        what_ran={"tools": ["notes.add"], "nested": [1, 2.5, None, True]},
        stored_bytes=2**40,
        created_at=AT,
        updated_at=AT,
    )


def stored(database: Path, execution_id: str) -> dict[str, Any]:
    """The row as SQLite holds it (its own types, no SQLAlchemy in between), but for what
    names it (its id, its idempotency key)."""
    with sqlite3.connect(database) as db:
        cursor = db.execute("SELECT * FROM executions WHERE id = ?", (execution_id,))
        names = [column[0] for column in cursor.description]
        return {k: v for k, v in zip(names, cursor.fetchone(), strict=True) if k not in NAMES}


def test_a_row_and_its_transition_are_stored_as_sqlalchemy_stores_them(
    store: SqlStore, database: Path
) -> None:
    table = Execution.__table__  # type: ignore[attr-defined]
    updates: dict[str, Any] = {
        "owner": None,
        "outcome": {"result": [1, "two", {"three": None}]},
        "logs": "a line\nanother\n",
        "deadline": None,
        "snapshot": None,
        "updated_at": AT + timedelta(seconds=3),
    }
    # Through the store: the driver's statements.
    store.commit((), (execution("by-the-store"),))
    store.commit([Change("execution", "by-the-store", "start", "pending", "running", 0, updates)])
    # Through SQLAlchemy, the same values.
    values = {c.name: getattr(execution("by-sqlalchemy"), c.name) for c in table.columns}
    with store.engine.begin() as conn:
        conn.execute(insert(table), values)
        conn.execute(
            update(table)
            .where(table.c.id == "by-sqlalchemy")
            .values(status="running", version=1, **updates)
        )
    assert stored(database, "by-the-store") == stored(database, "by-sqlalchemy")
    read = store.executions.get("by-the-store")
    assert read is not None
    assert read.outcome == updates["outcome"] and read.what_ran == values["what_ran"]
    assert read.created_at == AT and read.stored_bytes == 2**40


def test_a_unique_key_the_database_refuses_is_sqlalchemys_integrity_error(
    store: SqlStore,
) -> None:
    store.commit((), (execution("taken"),))
    with pytest.raises(IntegrityError):
        store.commit((), (execution("taken"),))
    assert store.executions.get("taken") is not None


@pytest.mark.parametrize("model", [Execution, OwedRequest, ToolCall, Session])
def test_a_new_row_holds_what_its_constructor_would(model: type[SQLModel]) -> None:
    # `new_row` skips the ORM's instrumentation and pydantic's `__setattr__` (120 us for an
    # execution's row), not a value: defaults included, it is the row `model(...)` makes.
    given = REQUIRED[model]
    table = model.__table__  # type: ignore[attr-defined]
    made, built = model(**given), new_row(model, **given)
    assert {c.name: getattr(built, c.name) for c in table.columns} == {
        c.name: getattr(made, c.name) for c in table.columns
    }
    with pytest.raises(TypeError, match="missing"):
        new_row(model, **{k: v for k, v in given.items() if k != "id"})
    with pytest.raises(TypeError, match="unknown"):
        new_row(model, **given, no_such_column=1)


REQUIRED: dict[type[SQLModel], dict[str, Any]] = {
    Execution: {
        "id": "e1",
        "principal_id": "p",
        "status": "pending",
        "code": "1",
        "created_at": AT,
        "updated_at": AT,
    },
    OwedRequest: {
        "id": "o1",
        "session_id": "s",
        "request_id": 7,
        "method": "tools/call",
        "status": "owed",
        "incarnation": 3,
        "created_at": AT,
    },
    ToolCall: {
        "id": "e1:1",
        "execution_id": "e1",
        "seq": 1,
        "tool": "notes.add",
        "status": "requested",
        "created_at": AT,
        "updated_at": AT,
    },
    Session: {
        "id": "s",
        "principal_id": "p",
        "status": "active",
        "protocol_version": "2025-06-18",
        "incarnation": 3,
        "last_activity": AT,
        "created_at": AT,
    },
}


def test_a_row_read_through_the_driver_is_the_row_sqlalchemy_reads(store: SqlStore) -> None:
    store.commit((), (execution("read-back"),))
    store.commit(
        [
            Change(
                "execution",
                "read-back",
                "start",
                "pending",
                "running",
                0,
                {"outcome": {"result": [1, None]}, "updated_at": AT + timedelta(seconds=1)},
            )
        ]
    )
    read = store.executions.get("read-back")
    with SqlSession(store.engine) as orm:
        expected = orm.get(Execution, "read-back")
        assert expected is not None and read is not None
        table = Execution.__table__  # type: ignore[attr-defined]
        for column in table.columns:
            assert getattr(read, column.name) == getattr(expected, column.name), column.name
    assert read.deadline is not None and read.deadline.tzinfo is UTC
    assert read.snapshot == b"\x00\x01sealed\xff"


def test_a_listener_on_sqlalchemys_statement_events_is_told_of_every_statement(
    store: SqlStore,
) -> None:
    # Instrumentation (OpenTelemetry's for SQLAlchemy, a test watching what is sent) hooks
    # these events: while one listens, the store's statements go through SQLAlchemy.
    told: list[str] = []

    def listen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        told.append(" ".join(statement.split()))

    event.listen(store.engine, "before_cursor_execute", listen)
    try:
        store.commit((), (execution("watched"),))
        store.commit([Change("execution", "watched", "start", "pending", "running", 0, {})])
        assert store.executions.get("watched") is not None
    finally:
        event.remove(store.engine, "before_cursor_execute", listen)
    for sent in ("INSERT INTO executions", "UPDATE executions", "INSERT INTO transition_log"):
        assert any(statement.startswith(sent) for statement in told), sent
    assert any(statement.startswith("SELECT executions.") for statement in told)


def test_statements_built_at_every_call_do_not_grow_the_compiled_cache_without_end(
    store: SqlStore,
) -> None:
    table = Execution.__table__  # type: ignore[attr-defined]
    for n in range(driver_statements.MAX_COMPILED + 100):
        built = select(table.c.id).where(table.c.id == bindparam("key"))
        assert driver_statement(built, store.engine.dialect) is not None, n
    assert len(driver_statements._compiled) <= driver_statements.MAX_COMPILED
