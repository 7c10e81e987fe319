"""What every group of read queries shares: the engine, and sessions opened like the store's.

Each domain's reads are a small class of their own (`SessionQueries`, `InstanceQueries`, ...),
reached from the store (`store.sessions`, `store.instances`, ...), so the SQL of a domain sits
in one module of `machine/db/` and callers never build a statement or open a session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Executable, bindparam, or_
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, SQLModel, select
from sqlmodel.sql.expression import SelectOfScalar

from lockgate.machine.db.connect import reader, snapshot_reader
from lockgate.machine.db.driver_statements import for_driver

Row = TypeVar("Row", bound=SQLModel)


@cache
def by_key(model: type[Row]) -> SelectOfScalar[Row]:
    """A row of `model` by its primary key, built once: `Session.get` builds its statement
    anew at every call, which cost a read a third more than the read itself."""
    (key,) = model.__table__.primary_key.columns  # type: ignore[attr-defined]
    return select(model).where(key == bindparam("key"))


@cache
def _builder(model: type[Row], columns: tuple[str, ...]) -> Callable[[Sequence[Any]], Row]:
    """How a result row of `model`'s columns (named `columns`, in that order) becomes a
    `model` instance, worked out once per model and column list."""
    mapper = sa_inspect(model)
    attribute = {prop.columns[0].name: prop.key for prop in mapper.column_attrs}
    names = tuple(attribute[column] for column in columns)
    new_instance = mapper.class_manager.new_instance

    def build(values: Sequence[Any]) -> Row:
        # What the ORM's loader does for each row (an instance made without __init__, so
        # without validation, its attributes set from the row's values), without the ORM's
        # per-statement machinery. The instance is not in any session (as an ORM row is
        # not once its session closed): the store writes through Core, never by adding it.
        row: Row = new_instance()
        row.__dict__.update(zip(names, values, strict=True))
        return row

    return build


@cache
def _defaults(model: type[Row]) -> tuple[Callable[[], Row], dict[str, Any], frozenset[str]]:
    """How to make an empty `model` instance, its columns' defaults, and the columns a new
    row must be given, worked out once per model."""
    mapper = sa_inspect(model)
    columns = {prop.key for prop in mapper.column_attrs}
    fields = {name: f for name, f in model.model_fields.items() if name in columns}
    defaults = {
        name: f.get_default(call_default_factory=True)
        for name, f in fields.items()
        if not f.is_required()
    }
    required = frozenset(name for name, f in fields.items() if f.is_required())
    return mapper.class_manager.new_instance, defaults, required


def new_row(model: type[Row], **values: Any) -> Row:
    """A new `model` row to insert, its columns' defaults filled in: what `model(**values)`
    makes for a table model (it validates nothing either), without setting each attribute
    through the ORM's instrumentation and pydantic's `__setattr__`, which cost 120 us for an
    execution's row (5 us this way), on every request."""
    new_instance, defaults, required = _defaults(model)
    missing = required - values.keys()
    unknown = values.keys() - required - defaults.keys()
    if missing or unknown:
        raise TypeError(f"{model.__name__}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    row: Row = new_instance()
    row.__dict__.update(defaults)
    row.__dict__.update(values)
    return row


def models(
    conn: Connection,
    model: type[Row],
    statement: Executable,
    params: Mapping[str, object] | None = None,
) -> list[Row]:
    """The `model` rows `statement` (a `select(model)`) reads on `conn`. Through Core, not an
    ORM session: a read of one row by primary key cost 0.30 ms through the ORM and 0.17 ms
    this way, and every request makes several."""
    sent = for_driver(conn, statement)
    if sent is not None:  # SQLite: past SQLAlchemy's execution machinery (50 us a read)
        build = _builder(model, sent.columns)
        return [build(values) for values in sent.rows(conn, params or {})]
    result = conn.execute(statement, params or {})
    build = _builder(model, tuple(result.keys()))
    return [build(values) for values in result]


def rows(
    conn: Connection, statement: Executable, params: Mapping[str, object] | None = None
) -> list[tuple[Any, ...]]:
    """What a select of columns (not of a model) reads on `conn`, row by row."""
    sent = for_driver(conn, statement)
    if sent is not None:
        return sent.rows(conn, params or {})
    return [tuple(row) for row in conn.execute(statement, params or {})]


def first(rows: Iterable[Row]) -> Row | None:
    return next(iter(rows), None)


class Queries:
    def __init__(
        self, engine: Engine, writer: AbstractContextManager[object] | None = None
    ) -> None:
        self.engine = engine
        self._reads = reader(engine)
        self._snapshots = snapshot_reader(engine)
        #: Held around a write of its own (`_writing`): the store's writer lock on SQLite.
        self._writer = writer if writer is not None else nullcontext()

    def _session(self) -> Session:
        """A session for reads: on SQLite it takes no lock (see `reader`). Rows stay
        readable once the session closes, as with `SqlStore.session`."""
        return Session(self._reads, expire_on_commit=False)

    def _get(self, model: type[Row], key: object) -> Row | None:
        """The row of `model` whose primary key is `key`, or None (a read of its own)."""
        return first(self._models(model, by_key(model), {"key": key}))

    def _models(
        self, model: type[Row], statement: Executable, params: Mapping[str, object] | None = None
    ) -> list[Row]:
        """The `model` rows a `select(model)` reads, as a read of its own (see `models`)."""
        sent = for_driver(self.engine, statement)
        if sent is None:
            with self._reads.connect() as conn:
                return models(conn, model, statement, params)
        # SQLite: a pooled connection without a SQLAlchemy `Connection` around it, so no
        # transaction begun and ended through the engine's events (105 us an empty read
        # that way, about 50 this one); its statement reads on its own, as a `reader`'s.
        pooled = self.engine.raw_connection()
        try:
            found = sent.rows_on(pooled.driver_connection, self.engine.dialect, params or {})
        finally:
            pooled.close()
        build = _builder(model, sent.columns)
        return [build(values) for values in found]

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        """A transaction for the few writes outside lifecycles (API keys, approval links),
        committed when the block ends. On SQLite it waits for the process's writer lock
        first, as the store's commits do (`GroupCommit`), rather than in SQLite's busy
        handler, which sleeps; its transaction holds the file's write lock from its first
        statement."""
        with self._writer, Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s


def same_value(column: Any, value: str | None) -> ColumnElement[bool]:
    """`column` holds `value`, None matching NULL (SQL's `=` never matches NULL): a
    principal's own row or everyone's, a rule's condition or none."""
    held: ColumnElement[bool] = column.is_(None) if value is None else column == value
    return held


def applies_to(column: Any, principal_id: str | None) -> ColumnElement[bool]:
    """A row for everyone, or `principal_id`'s own (for None: everyone's only)."""
    if principal_id is None:
        return same_value(column, None)
    return or_(column.is_(None), column == principal_id)
