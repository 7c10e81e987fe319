"""Group commit on SQLite: the commits that are ready together share one transaction.

SQLite lets one writer in at a time, and a connection that finds the file locked waits in
its busy handler, which sleeps and retries (1, 2, 5, ... up to 100 ms between tries). With a
few requests at once, writers spent most of their time asleep while the lock was free, and
each commit paid its own fsync (8 MCP clients: a request's p99 near a second).

Here a commit queues its statements and takes the process's writer lock. The thread that
gets it commits every commit queued by then, in one transaction, each inside a savepoint
of its own; the others find theirs done when they get the lock, or lead the next group. No
thread waits on a timer: under load the groups grow by themselves, alone a commit is a
group of one. One commit failing (a stale version, a used link, a unique key) rolls back to
its savepoint and fails that commit only; a failed COMMIT fails the whole group, as nothing
of it committed. Each commit keeps its own transaction id in the transition log.

The group waits for the disk when any of its commits does (`wait_for_disk`); a commit that
need not wait loses nothing by riding along. The group's leader also takes a lock on a file
next to the database (`FileTurn`), so the worker processes of one `lockgate serve`, and any
other instance on the file, take turns without the busy handler's sleeps; a process that
does not take it (the `sqlite3` shell) still meets the busy handler. PostgreSQL locks rows,
not the database, and groups concurrent commits' WAL flushes itself: there each commit is a
transaction of its own (`SoloCommit`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, event

from lockgate.machine.db.connect import lazy_from_now

#: What one commit runs in its transaction; it refuses by raising.
Statements = Callable[[Connection], None]

#: Commits taken into one transaction at most: a group holds the write lock as long as its
#: statements take, so other processes on the file wait no longer than this many commits.
MAX_GROUP = 64


log = logging.getLogger(__name__)


class FileTurn:
    """An exclusive `flock` on a file next to the database: the writer's turn among the
    processes on it. Not for threads: one process's threads take `WriterLock.threads` first.

    By hand because nothing else does it: SQLite's own lock makes a process that finds the file
    locked sleep in its busy handler on a timer (1, 2, 5, ... 100 ms between tries), and
    Python's sqlite3 cannot replace that handler. Two worker processes under load spent a
    fifth of their time asleep while the file was free, and served no more than one. A waiter
    on an flock is woken by the kernel the moment the writer lets go.

    Taken right before a write transaction begins and let go right after it ends, it orders
    writers as SQLite's lock does, so it adds no new way to deadlock. If the file cannot be
    opened (a read-only folder, a symbolic link in its place), the process goes on with the
    busy handler alone.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._fd: int | None = None
        self._opened_by = 0
        #: Closes the descriptor when the store is let go (a process may open many stores).
        self._closer: weakref.finalize[[int], FileTurn] | None = None

    def __enter__(self) -> None:
        fd = self._open()
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits with the GIL released

    def __exit__(self, *_exc: object) -> None:
        if self._fd is not None and self._opened_by == os.getpid():
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _open(self) -> int | None:
        if self._path is None:
            return None
        # Opened by the process that takes it: a descriptor inherited across a fork shares
        # its lock with the parent's, and would exclude nobody.
        if self._fd is None or self._opened_by != os.getpid():
            if self._closer is not None:
                self._closer()  # this process's copy of the parent's: closing it frees nothing
            try:
                # Not through a link: one planted in the database's folder would have the
                # server create and lock a file wherever it points.
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self._path, flags, 0o600)
            except OSError as exc:
                log.warning("writers on %s wait in SQLite's busy handler: %s", self._path, exc)
                self._path, self._fd, self._closer = None, None, None
                return None
            self._opened_by = os.getpid()
            self._closer = weakref.finalize(self, os.close, self._fd)
        return self._fd


class WriterLock:
    """The writer's turn on one SQLite file: among this process's threads (`threads`), then
    among the processes on the file (`file`). Held whole by a write outside the lifecycles;
    `GroupCommit` takes the file's turn only when it leads a group."""

    def __init__(self, path: Path | None) -> None:
        self.threads = threading.Lock()
        self.file = FileTurn(path)

    def __enter__(self) -> None:
        self.threads.acquire()
        try:
            self.file.__enter__()
        except BaseException:
            self.threads.release()
            raise

    def __exit__(self, *_exc: object) -> None:
        try:
            self.file.__exit__()
        finally:
            self.threads.release()


class Committer(Protocol):
    def commit(self, statements: Statements, *, wait_for_disk: bool) -> None: ...


class SoloCommit:
    """Each commit in a transaction of its own."""

    def __init__(self, engine: Engine, lazy: Engine) -> None:
        self.engine, self.lazy = engine, lazy

    def commit(self, statements: Statements, *, wait_for_disk: bool) -> None:
        with (self.engine if wait_for_disk else self.lazy).begin() as conn:
            statements(conn)


class _Queued:
    def __init__(self, statements: Statements, wait_for_disk: bool) -> None:
        self.statements, self.wait_for_disk = statements, wait_for_disk
        self.done = False
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None) -> None:
        self.error, self.done = error, True


#: Connections a forked process inherited with a store (its parent's): never used nor closed
#: here. Kept referenced so that collecting them does not close the parent's file handles.
_INHERITED: list[Connection] = []


def _close_if_mine(conn: Connection, pid: int) -> None:
    if os.getpid() == pid:
        conn.close()


class GroupCommit:
    """Commits ready together, in one transaction (see the module's docstring)."""

    def __init__(self, engine: Engine, lock_file: Path | None = None) -> None:
        self.engine = engine
        #: Held by the thread committing a group; whoever waits for it has queued already.
        self.writer = WriterLock(lock_file)
        self._queue_lock = threading.Lock()
        self._queue: deque[_Queued] = deque()
        # The groups' connection, kept from one group to the next (used only by the thread
        # holding `writer.threads`): taking one from the pool for each commit, and handing
        # it back (the pool's checkout, its reset's ROLLBACK, the events) cost about 60 us
        # of Python a commit, a quarter of a small one, while the file's writer waits.
        self._conn: Connection | None = None
        self._conn_pid = 0
        # `Engine.dispose()` closes the connections in the pool, not one kept out of it: this
        # one goes too (the server disposes its engine before it forks its workers, so that
        # none inherits a connection).
        group = weakref.ref(self)

        def close_on_dispose(_engine: Engine) -> None:
            alive = group()
            if alive is not None:
                alive.close()

        event.listen(engine, "engine_disposed", close_on_dispose)

    def close(self) -> None:
        """Close the groups' connection (the next group opens one again). Not handed back:
        the pool it came from is the one the engine's dispose has just emptied."""
        with self.writer.threads:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.invalidate()
                self._conn.close()
            self._conn = None

    def _connection(self, wait_for_disk: bool) -> Connection:
        if self._conn is None or self._conn_pid != os.getpid():
            if self._conn is not None:
                _INHERITED.append(self._conn)  # the parent's, copied by a fork
            self._conn = self.engine.connect()
            self._conn_pid = os.getpid()
            # Back to the pool when the store is let go (a process may open many stores).
            weakref.finalize(self, _close_if_mine, self._conn, self._conn_pid)
        lazy_from_now(self._conn, not wait_for_disk)
        return self._conn

    @property
    def waiting(self) -> int:
        """Commits queued and not yet taken into a group."""
        with self._queue_lock:
            return len(self._queue)

    def commit(self, statements: Statements, *, wait_for_disk: bool) -> None:
        mine = _Queued(statements, wait_for_disk)
        with self._queue_lock:
            self._queue.append(mine)
        with self.writer.threads:
            # Led by someone else meanwhile (no turn on the file needed), or more than a
            # group ahead of it: lead.
            if not mine.done:
                with self.writer.file:
                    while not mine.done:
                        self._commit_group(mine)
        if mine.error is not None:
            raise mine.error

    def _commit_group(self, leader: _Queued) -> None:
        with self._queue_lock:
            group = [self._queue.popleft() for _ in range(min(MAX_GROUP, len(self._queue)))]
        conn = self._connection(any(q.wait_for_disk for q in group))
        failed: dict[int, Exception] = {}
        try:
            with conn.begin():
                if len(group) == 1:
                    group[0].statements(conn)
                else:
                    # The savepoints on the driver's connection, not `begin_nested`: the same
                    # three statements, but SQLAlchemy's nested transactions cost 125 us of
                    # Python a commit (3 us here), all of it while the file's writer waits.
                    raw: Any = conn.connection.driver_connection
                    for n, queued in enumerate(group):
                        raw.execute("SAVEPOINT lockgate_commit")
                        try:
                            queued.statements(conn)
                        except Exception as exc:  # that commit's own refusal: its alone
                            raw.execute("ROLLBACK TO SAVEPOINT lockgate_commit")
                            failed[n] = exc
                        raw.execute("RELEASE SAVEPOINT lockgate_commit")
        except Exception as exc:
            # Nothing of the group committed (a single commit's refusal, or the COMMIT).
            for queued in group:
                queued.settle(exc)
            return
        except BaseException:
            # This thread is being torn down (an interrupt): nothing of the group committed.
            # The others' commits go back to the front of the queue for the next leader;
            # this thread's own is dropped with the exception it raises.
            with self._queue_lock:
                self._queue.extendleft(q for q in reversed(group) if q is not leader)
            raise
        for n, queued in enumerate(group):
            queued.settle(failed.get(n))
