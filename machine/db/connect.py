"""Opening the database: SQLite (the embedded default) or PostgreSQL (psycopg 3)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

#: An open database, as code outside machine/db/ names it (it never touches SQLAlchemy).
Database = Engine


def normalise_url(url: str) -> str:
    """Use psycopg 3 for PostgreSQL whatever spelling the platform gave us."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class OpenTransactions:
    """The SQLite transactions this process holds open, so that it can be paused holding
    none: a process stopped mid-transaction would hold the file's write lock, and every
    other instance on the file would wait for it. Only the real-process simulation pauses a
    process (`machine.faults`, `LOCKGATE_STOP_AT`); for everything else this is a counter."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open = 0
        self._frozen = False

    def enter(self) -> None:
        with self._changed:
            while self._frozen:
                self._changed.wait()
            self._open += 1

    def leave(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    @contextmanager
    def none_open(self) -> Iterator[None]:
        """Wait until no transaction is open, and let none begin inside the block."""
        with self._changed:
            while self._open > 0:
                self._changed.wait()
            self._frozen = True
        try:
            yield
        finally:
            with self._changed:
                self._frozen = False
                self._changed.notify_all()


TRANSACTIONS = OpenTransactions()


_OPEN = "lockgate_transaction_open"

#: The execution option of `reader`'s connections.
_READ_ONLY = "lockgate_read_only"
#: The execution option of `snapshot_reader`'s connections.
_SNAPSHOT = "lockgate_snapshot"
#: The execution option of `lazy_commits`' connections.
_LAZY = "lockgate_lazy_commit"
#: What a SQLite connection's `synchronous` is set to now (kept in its `info`).
_SYNCHRONOUS = "lockgate_synchronous"


def reader(engine: Engine) -> Engine:
    """`engine` for reads: the same pool and events, but on SQLite no transaction is begun:
    each statement reads the last committed state on its own, taking no lock, so a read
    never queues behind another transaction's commit and fsync, as `BEGIN IMMEDIATE` does.
    That is what PostgreSQL's default isolation (READ COMMITTED, which Lockgate runs on)
    gives every statement of a transaction, so no read of the store relies on more; and it
    saves the BEGIN and ROLLBACK statements (about a sixth of a short read's cost). On
    PostgreSQL, the same: each statement in autocommit, as READ COMMITTED would read it in a
    transaction, without the BEGIN and ROLLBACK round trips (a read was three). A
    transaction that writes must not use it: its reads must hold the write lock with it."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(**{_READ_ONLY: True}, isolation_level="AUTOCOMMIT")
    return engine.execution_options(**{_READ_ONLY: True})


def reads_only(conn: Connection) -> bool:
    """Whether `conn` is one of `reader`'s or `snapshot_reader`'s: its transaction, if it
    has one, writes nothing (a COMMIT ending it writes and flushes nothing)."""
    return bool(conn.get_execution_options().get(_READ_ONLY))


def snapshot_reader(engine: Engine) -> Engine:
    """`engine` for the few reads of several statements that must see one moment (a view
    of an execution with its calls): on SQLite a deferred transaction (no lock, one
    snapshot of the log), on PostgreSQL REPEATABLE READ for that transaction (psycopg
    begins it with `BEGIN ISOLATION LEVEL REPEATABLE READ`: no statement of its own)."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(
            **{_READ_ONLY: True, _SNAPSHOT: True}, isolation_level="REPEATABLE READ"
        )
    return engine.execution_options(**{_READ_ONLY: True, _SNAPSHOT: True})


def lazy_commits(engine: Engine) -> Engine:
    """`engine` for commits that return before the disk has them
    (`TransitionSpec.waits_for_disk` False): SQLite commits them with `synchronous=NORMAL`
    (in WAL mode: appended to the log, not fsynced), PostgreSQL with `synchronous_commit =
    off`. Either way the commit survives the process's death, and the next commit that
    waits for the disk flushes it too, as both logs are written in order."""
    return engine.execution_options(**{_LAZY: True})


def lazy_from_now(conn: Connection, lazy: bool) -> None:
    """Whether the transactions `conn` begins from now on return before the disk has them
    (as `lazy_commits`, for a connection kept from one commit to the next). Its options
    are changed only when they say otherwise (a change dispatches SQLAlchemy's events)."""
    if bool(conn.get_execution_options().get(_LAZY)) != lazy:
        conn.execution_options(**{_LAZY: lazy})


def _synchronous(conn: Any, raw: Any, lazy: bool) -> None:
    """Set the connection's `synchronous` for the transaction about to begin (a pragma that
    cannot change inside one), only when it differs from what it is."""
    wanted = "NORMAL" if lazy else "FULL"
    if conn.info.get(_SYNCHRONOUS, "FULL") != wanted:
        raw.execute(f"PRAGMA synchronous={wanted}")
        conn.info[_SYNCHRONOUS] = wanted


def _begin(conn: Any) -> None:
    options = conn.get_execution_options()
    # BEGIN and the pragma on the driver's connection, not through `exec_driver_sql`: they
    # return nothing, and SQLAlchemy's statement machinery cost more than SQLite's own work
    # (a request switched `synchronous` about four times, 1.2 ms of its 21).
    raw = conn.connection.driver_connection
    if options.get(_READ_ONLY):
        # Not counted in TRANSACTIONS: a paused reader holds no lock another instance
        # waits on. Without a snapshot, no transaction: each statement is its own read.
        if options.get(_SNAPSHOT):
            raw.execute("BEGIN")
        return
    _synchronous(conn, raw, bool(options.get(_LAZY)))
    TRANSACTIONS.enter()
    try:
        raw.execute("BEGIN IMMEDIATE")
    except BaseException:
        TRANSACTIONS.leave()
        raise
    conn.info[_OPEN] = True


def _end(conn: Any) -> None:
    # Counted once per transaction that began, whatever events the connection fires.
    if conn.info.pop(_OPEN, False):
        TRANSACTIONS.leave()


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


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL stores the database in, as `open_engine` opens it; None for an
    in-memory database or another backend (for what is kept next to the file)."""
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    return Path(database).expanduser()


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
        # that reads then writes holds the write lock from its first statement (reads, on
        # `reader(engine)`, take none).
        event.listen(engine, "begin", _begin)
        event.listen(engine, "commit", _end)
        event.listen(engine, "rollback", _end)

        @event.listens_for(engine, "connect")
        def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        return engine
    # Not `pool_pre_ping`, which pings at every checkout: a round trip for each commit and
    # each read (9 of an approved write's 40). A connection is pinged when it has been idle
    # in the pool a while (`_ping_if_idle`), which covers a server restarted or failed over
    # meanwhile (that takes longer than the idle time); under load none is.
    engine = create_engine(url, pool_size=10, max_overflow=10)
    event.listen(engine, "begin", _begin_postgres)
    event.listen(engine, "checkin", _idle_from_now)
    event.listen(engine, "checkout", functools.partial(_ping_if_idle, engine.dialect))
    return engine


#: A pooled PostgreSQL connection idle longer than this is pinged before it is used.
PING_AFTER_IDLE_SECS = 0.5
#: When a pooled connection went back to the pool (kept in its record's `info`).
_IDLE_SINCE = "lockgate_idle_since"


def _idle_from_now(_dbapi_connection: Any, record: Any) -> None:
    record.info[_IDLE_SINCE] = time.monotonic()


def _ping_if_idle(dialect: Any, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """SQLAlchemy's pessimistic disconnect handling, for connections idle a while only: a
    dead one is reported as `DisconnectionError`, and the pool replaces it (and retries)."""
    since = record.info.get(_IDLE_SINCE)
    if since is None or time.monotonic() - since < PING_AFTER_IDLE_SECS:
        return
    try:
        alive = dialect.do_ping(dbapi_connection)
    except Exception as exc:
        raise DisconnectionError("the pooled connection is gone") from exc
    if not alive:
        raise DisconnectionError("the pooled connection is gone")


def _begin_postgres(conn: Any) -> None:
    options = conn.get_execution_options()
    if options.get(_LAZY):
        # For this transaction only: the server acknowledges the commit before its WAL
        # record is flushed (it flushes it within wal_writer_delay, or with the next
        # synchronous commit).
        conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")
