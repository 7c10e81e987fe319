"""The store's statements sent to SQLite's driver directly.

SQLAlchemy's execution of a statement already compiled (its execution context, parameter
handling, result object and events) costs about 40 us of Python on top of SQLite's own
12 us for an insert into the transition log, and a request's commits and reads send about
twenty such statements, the commits' while the file's writer lock is held. Here each
statement the store builds once is compiled once more for the driver: its SQL, the order of
its parameters, the bind processors SQLAlchemy itself would apply to each value (a datetime
as SQLite's text, a JSON value serialised) and, for a select, the result processors it would
apply to each column read (the text back to an aware datetime, the JSON parsed); sending it
is then one call on the driver's connection, inside whatever transaction SQLAlchemy began.
Written by hand because SQLAlchemy has no public way to skip its per-execution machinery for
a statement it has compiled.

On SQLite only: the commit path's inserts and updates (`SqlStore.commit`) and the reads of
rows (`queries.models`, `queries.rows`). A statement whose parameters SQLAlchemy expands at
each execution (an `IN` list) goes through SQLAlchemy, as every statement does on
PostgreSQL (psycopg prepares them on the server after a few runs, and that path is measured
on its own). While anything listens to SQLAlchemy's statement events, every statement goes
through SQLAlchemy, so that the listener is told of each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Insert, Select, Update
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

Processor = Callable[[Any], Any] | None


class Unsupported(Exception):
    """A statement the driver cannot be sent directly (parameters SQLAlchemy expands at
    each execution, `IN` lists): it goes through SQLAlchemy."""


class DriverStatement:
    """One statement compiled for the driver, for one set of parameter names."""

    def __init__(
        self, statement: Insert | Update | Select[Any], dialect: Dialect, keys: Sequence[str]
    ):
        # An insert's columns are the keys it is given; an update's are in the statement.
        columns = list(keys) if isinstance(statement, Insert) else None
        compiled = statement.compile(dialect=dialect, column_keys=columns)
        if compiled.positiontup is None:
            raise Unsupported(f"{dialect.name} does not take positional parameters")
        if any(b.expanding or b.literal_execute for b in compiled.binds.values()):
            raise Unsupported("its parameters are expanded at each execution")
        self.sql = compiled.string
        self.names = tuple(compiled.positiontup)
        self.processors: tuple[Processor, ...] = tuple(
            compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in self.names
        )
        #: Values the statement carries itself (a literal in a `CASE`, a `LIMIT`).
        self.fixed = {
            name: bind.effective_value for name, bind in compiled.binds.items() if not bind.required
        }
        #: A select's columns, by name, and how each value read is converted.
        selected = statement.selected_columns if isinstance(statement, Select) else ()
        self.columns = tuple(column.name for column in selected)
        self.results: tuple[Processor, ...] = tuple(
            column.type.dialect_impl(dialect).result_processor(dialect, None) for column in selected
        )

    def parameters(self, values: Mapping[str, object]) -> list[object]:
        if self.fixed:
            values = {**self.fixed, **values}
        return [
            value if process is None else process(value)
            for value, process in zip(
                (values[name] for name in self.names), self.processors, strict=True
            )
        ]

    def run(self, conn: Connection, values: Mapping[str, object]) -> int:
        """Send it with `values` on `conn`'s driver connection; the rows it changed."""
        parameters = self.parameters(values)
        with _as_sqlalchemy_error(conn.dialect, self.sql, parameters):
            cursor = _driver(conn).execute(self.sql, parameters)
        return int(cursor.rowcount)

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, object]]) -> None:
        parameters = [self.parameters(row) for row in rows]
        with _as_sqlalchemy_error(conn.dialect, self.sql, parameters):
            _driver(conn).executemany(self.sql, parameters)

    def rows(self, conn: Connection, values: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """A select's rows, each value converted as SQLAlchemy's result would."""
        return self.rows_on(_driver(conn), conn.dialect, values)

    def rows_on(
        self, driver: Any, dialect: Dialect, values: Mapping[str, object]
    ) -> list[tuple[Any, ...]]:
        """`rows` on a driver connection of `dialect`'s taken from the pool without a
        SQLAlchemy `Connection` around it (`Queries._models`)."""
        parameters = self.parameters(values)
        with _as_sqlalchemy_error(dialect, self.sql, parameters):
            found: list[tuple[Any, ...]] = driver.execute(self.sql, parameters).fetchall()
        results = self.results
        if not any(results):
            return found
        return [
            tuple(v if p is None else p(v) for v, p in zip(row, results, strict=True))
            for row in found
        ]


def _driver(conn: Connection) -> Any:
    return conn.connection.driver_connection


@contextmanager
def _as_sqlalchemy_error(dialect: Dialect, sql: str, parameters: Sequence[Any]) -> Iterator[None]:
    """The driver's errors raised as SQLAlchemy raises them (`IntegrityError` for a unique
    key, ...), so that callers see one kind of error whichever way a statement went."""
    base: type[Exception] = dialect.loaded_dbapi.Error
    try:
        yield
    except base as exc:
        raise DBAPIError.instance(sql, parameters, exc, base, dialect=dialect) from exc


_compiled: dict[tuple[int, str, tuple[str, ...]], tuple[object, DriverStatement | None]] = {}
_compiling = threading.Lock()
#: The store builds a few dozen statements; a caller that built one at each call would
#: otherwise grow the cache (and keep its statements) without end.
MAX_COMPILED = 1024


def driver_statement(
    statement: Insert | Update | Select[Any], dialect: Dialect, keys: Sequence[str] = ()
) -> DriverStatement | None:
    """`statement` compiled for the driver once per set of parameter names (None: it goes
    through SQLAlchemy, see `Unsupported`). Only for statements built once and kept (the
    store's `@cache`d builders): the cache holds them."""
    key = (id(statement), dialect.name, tuple(keys))
    found = _compiled.get(key)
    if found is None or found[0] is not statement:
        with _compiling:
            try:
                compiled: DriverStatement | None = DriverStatement(statement, dialect, keys)
            except Unsupported:
                compiled = None
            found = (statement, compiled)
            if len(_compiled) >= MAX_COMPILED:
                _compiled.clear()
            _compiled[key] = found
    return found[1]


def for_driver(
    target: Connection | Engine, statement: object, keys: Sequence[str] = ()
) -> DriverStatement | None:
    """`statement` as sent to `target`'s driver directly, or None when it goes through
    SQLAlchemy (not SQLite, something listening, not a select, insert or update, or see
    `Unsupported`). The one place that decides which way a statement goes."""
    if not isinstance(statement, (Select, Insert, Update)) or not sends_to_driver(target):
        return None
    return driver_statement(statement, target.dialect, keys)


def sends_to_driver(conn: Connection | Engine) -> bool:
    """Whether the store's statements go to `conn`'s driver directly: on SQLite, unless
    something listens to SQLAlchemy's statement events (an instrumentation such as
    OpenTelemetry's, a test watching what is sent), which then sees every statement go
    through SQLAlchemy, the same SQL."""
    return conn.dialect.name == "sqlite" and not (
        conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute
    )
