"""The sides a case compares, each timing one execution of N tool calls on one database.

- `LockgateSide`: the real engine (`Runtime.create`, the sandbox, the write path, the store)
  running agent code whose tool bodies do nothing (`bench.tools`).
- `DbosSide`: DBOS, the peer, one workflow of N steps on the same kind of database.
- `BareCommits`: the floor, N fsync'd commits of one small row each, with the same driver
  and durability settings as Lockgate's store.
- `MontyInMemory`: the same code in Lockgate's sandbox with no database at all (the cost of
  the interpreter, its worker process and its snapshots, without a journal).

Each `run(n)` returns the wall seconds of one execution; commits are counted with
SQLAlchemy's engine events where a side has an engine of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from pydantic import SecretStr
from sqlalchemy import Connection, Engine, create_engine, event, text

from bench.tools import BenchSource, reads, writes
from lockgate.machine.db.connect import open_engine, reads_only
from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox import Sandbox
from lockgate.machine.sandbox_results import Failed, Finished, Returned, Suspended
from lockgate.machine.secrets import StaticSecrets
from lockgate.machine.settings import Settings
from lockgate.spec import ExecutionStatus

PRINCIPAL = "bench"
#: Signs approval links; on PostgreSQL the server needs one configured (none is ever used).
SIGNING_KEY = "bench-signing-key-that-signs-no-link-0123456789"


class Side(Protocol):
    name: str

    def run(self, n: int) -> float: ...

    def close(self) -> None: ...


class CommitCounter:
    """Counts the transactions an engine commits that may write (SQLAlchemy's `commit`
    event: one per COMMIT sent to the database; a view's read-only transaction, which ends
    with a COMMIT that writes and flushes nothing, is not one)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "commit", self._commit)

    def _commit(self, conn: Connection) -> None:
        if not reads_only(conn):
            self.count += 1


class LockgateSide:
    def __init__(self, database_url: str, workdir: Path, *, kind: str = "reads") -> None:
        self.name = f"lockgate_{kind}"
        self.kind = kind
        settings = Settings(
            database_url=database_url,
            notes_dir=workdir / "notes",
            max_duration_secs=120,
            signing_keys=None if database_url.startswith("sqlite") else SecretStr(SIGNING_KEY),
        )
        self.runtime = Runtime.create(settings, sources=[BenchSource()], secrets=StaticSecrets({}))
        self.commits = CommitCounter(self.runtime.engine.store.engine)

    def run(self, n: int) -> float:
        engine = self.runtime.engine
        code = reads(n) if self.kind == "reads" else writes(n)
        started = time.perf_counter()
        view = engine.execute(PRINCIPAL, code)
        while view.status is ExecutionStatus.WAITING_FOR_INTERACTION:
            view = engine.resume(view.id, PRINCIPAL, Action.ACCEPT)
        elapsed = time.perf_counter() - started
        if view.status is not ExecutionStatus.COMPLETED or view.result != sum(range(n)):
            raise RuntimeError(f"{self.name}: the execution ended {view.status}: {view.result}")
        return elapsed

    def close(self) -> None:
        self.runtime.sandbox.close()
        self.runtime.engine.store.engine.dispose()


class BareCommits:
    """N commits of one row each, plus the two an execution's start and end would take, on
    the store's own engine settings (`open_engine`: WAL and synchronous=FULL on SQLite)."""

    name = "bare_commit"

    def __init__(self, database_url: str) -> None:
        self.engine = open_engine(database_url)
        with self.engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS bench_floor (n INTEGER, at TEXT)"))
        self.commits = CommitCounter(self.engine)

    def run(self, n: int) -> float:
        started = time.perf_counter()
        with self.engine.connect() as conn:
            for i in range(n + 2):
                conn.execute(text("INSERT INTO bench_floor VALUES (:n, :at)"), {"n": i, "at": "x"})
                conn.commit()
        return time.perf_counter() - started

    def close(self) -> None:
        self.engine.dispose()


class DbosSide:
    """One DBOS workflow of N steps. DBOS is one per process, so a process measures DBOS on
    one database only (the runner gives each database its own process)."""

    name = "dbos"

    def __init__(self, database_url: str) -> None:
        from dbos import DBOS, DBOSConfig

        if database_url.startswith("sqlite"):
            _wal_full(database_url)
        config: DBOSConfig = {"name": "lockgate-bench", "system_database_url": database_url}
        DBOS(config=config)

        @DBOS.step()
        def echo(value: int) -> int:
            return value

        @DBOS.workflow()
        def workflow(n: int) -> int:
            total = 0
            for i in range(n):
                total += echo(i)
            return total

        self._workflow: Callable[[int], int] = workflow
        DBOS.launch()
        self._dbos = DBOS
        self.commits = _dbos_commits()

    def run(self, n: int) -> float:
        started = time.perf_counter()
        total = self._workflow(n)
        elapsed = time.perf_counter() - started
        if total != sum(range(n)):
            raise RuntimeError(f"dbos: the workflow answered {total}")
        return elapsed

    def close(self) -> None:
        self._dbos.destroy(destroy_registry=True)


def _wal_full(database_url: str) -> None:
    """Put DBOS's SQLite file in WAL mode before DBOS opens it, as Lockgate's is (the mode
    is kept in the file; synchronous is SQLite's default, FULL, on every connection)."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        conn.execute(text("PRAGMA journal_mode=WAL"))
    engine.dispose()


def _dbos_commits() -> CommitCounter | None:
    """A counter on DBOS's system database engine, where this version keeps it (private
    names: None when an upgrade moves them, and the figure is then left out)."""
    import dbos._dbos

    instance = getattr(dbos._dbos, "_dbos_global_instance", None)
    engine = getattr(getattr(instance, "_sys_db_field", None), "engine", None)
    return CommitCounter(engine) if isinstance(engine, Engine) else None


class MontyInMemory:
    """The code of `LockgateSide(kind="reads")` in Lockgate's own sandbox, answered in
    memory: no database, no journal, no policy."""

    name = "monty_in_memory"

    def __init__(self) -> None:
        self.sandbox = Sandbox({"bench": ("echo", "record")}, max_processes=1)

    def run(self, n: int) -> float:
        started = time.perf_counter()
        step = self.sandbox.start(reads(n), principal=PRINCIPAL)
        while isinstance(step, Suspended):
            value = step.request.kwargs["value"]
            step = self.sandbox.resume(step.snapshot, Returned(value), principal=PRINCIPAL)
        elapsed = time.perf_counter() - started
        if isinstance(step, Failed) or not isinstance(step, Finished):
            raise RuntimeError(f"monty: {step}")
        if step.output != sum(range(n)):
            raise RuntimeError(f"monty: the code answered {step.output}")
        return elapsed

    def close(self) -> None:
        self.sandbox.close()


@contextmanager
def opened(side: Side) -> Iterator[Side]:
    try:
        yield side
    finally:
        side.close()
