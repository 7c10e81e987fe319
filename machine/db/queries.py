"""What every group of read queries shares: the engine, and sessions opened like the store's.

Each domain's reads are a small class of their own (`SessionQueries`, `InstanceQueries`, ...),
reached from the store (`store.sessions`, `store.instances`, ...), so the SQL of a domain sits
in one module of `machine/db/` and callers never build a statement or open a session.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlmodel import Session


class Queries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _session(self) -> Session:
        # As `SqlStore.session`: rows stay readable once the session closes or commits.
        return Session(self.engine, expire_on_commit=False)
