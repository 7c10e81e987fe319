"""Opening the database: SQLite (the embedded default) or PostgreSQL (psycopg 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


def normalise_url(url: str) -> str:
    """Use psycopg 3 for PostgreSQL whatever spelling the platform gave us."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer, and a commit is one append to the log.
    cursor.execute("PRAGMA journal_mode=WAL")
    # FULL, not NORMAL: in WAL mode NORMAL can lose the last commits on power loss (a
    # process crash loses nothing either way). A person's approval, or the intent written
    # before a tool's effect, must not be forgotten once acknowledged, and our write rate
    # (a few transitions per tool call) makes the extra fsync per commit cheap.
    cursor.execute("PRAGMA synchronous=FULL")
    # Several threads and processes share the file: wait for a lock instead of failing.
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def open_engine(url: str) -> Engine:
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 10},
            # One connection per thread; SQLite serialises writers itself.
            pool_pre_ping=False,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        # pysqlite's own transaction handling defers BEGIN; take it over so a transaction
        # that reads then writes holds the write lock from its first statement.
        event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))

        @event.listens_for(engine, "connect")
        def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)
