"""A store on a migrated SQLite file of its own, for the tests of the store's own parts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.store import SqlStore


@contextmanager
def sqlite_store(database: Path) -> Iterator[SqlStore]:
    """A store on `database`, migrated; its engine disposed at the end."""
    engine = open_engine(f"sqlite:///{database}")
    upgrade(engine)
    try:
        yield SqlStore(engine)
    finally:
        engine.dispose()
