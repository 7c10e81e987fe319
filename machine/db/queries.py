"""What every group of read queries shares: the engine, and sessions opened like the store's.

Each domain's reads are a small class of their own (`SessionQueries`, `InstanceQueries`, ...),
reached from the store (`store.sessions`, `store.instances`, ...), so the SQL of a domain sits
in one module of `machine/db/` and callers never build a statement or open a session.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlmodel import Session

from lockgate.machine.db.connect import reader


class Queries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._reads = reader(engine)

    def _session(self) -> Session:
        """A session for reads: on SQLite it takes no lock (see `reader`). Rows stay
        readable once the session closes, as with `SqlStore.session`."""
        return Session(self._reads, expire_on_commit=False)

    def _write_session(self) -> Session:
        """A session for the few writes outside lifecycles (API keys, approval links): on
        SQLite its transaction holds the write lock from its first statement."""
        return Session(self.engine, expire_on_commit=False)
