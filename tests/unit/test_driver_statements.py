"""The commit path's statements sent to SQLite's driver directly
(`machine.db.driver_statements`): what they store is byte for byte what SQLAlchemy would
have stored, and the database's refusals reach callers as SQLAlchemy's errors."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore
from lockgate.machine.records import Change

NAMES = ("id", "idempotency_key")
AT = datetime(2026, 12, 7, 22, 46, 4, 41982, tzinfo=UTC)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return tmp_path / "lockgate.db"


@pytest.fixture
def store(database: Path) -> Iterator[SqlStore]:
    engine = open_engine(f"sqlite:///{database}")
    upgrade(engine)
    try:
        yield SqlStore(engine)
    finally:
        engine.dispose()


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
    store.commit(
        [Change("execution", "by-the-store", "start", "pending", "running", 0, updates)]
    )
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
