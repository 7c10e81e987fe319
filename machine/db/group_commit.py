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
need not wait loses nothing by riding along. Other processes on the file (a second
instance, the CLI) still meet the busy handler. PostgreSQL locks rows, not the database,
and groups concurrent commits' WAL flushes itself: there each commit is a transaction of its
own (`SoloCommit`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import Connection, Engine

#: What one commit runs in its transaction; it refuses by raising.
Statements = Callable[[Connection], None]

#: Commits taken into one transaction at most: a group holds the write lock as long as its
#: statements take, so other processes on the file wait no longer than this many commits.
MAX_GROUP = 64


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


class GroupCommit:
    """Commits ready together, in one transaction (see the module's docstring)."""

    def __init__(self, engine: Engine, lazy: Engine) -> None:
        self.engine, self.lazy = engine, lazy
        #: Held by the thread committing a group; whoever waits for it has queued already.
        self.writer = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: deque[_Queued] = deque()

    @property
    def waiting(self) -> int:
        """Commits queued and not yet taken into a group."""
        with self._queue_lock:
            return len(self._queue)

    def commit(self, statements: Statements, *, wait_for_disk: bool) -> None:
        mine = _Queued(statements, wait_for_disk)
        with self._queue_lock:
            self._queue.append(mine)
        with self.writer:
            # Led by someone else meanwhile, or more than a group ahead of it: lead.
            while not mine.done:
                self._commit_group(mine)
        if mine.error is not None:
            raise mine.error

    def _commit_group(self, leader: _Queued) -> None:
        with self._queue_lock:
            group = [self._queue.popleft() for _ in range(min(MAX_GROUP, len(self._queue)))]
        engine = self.engine if any(q.wait_for_disk for q in group) else self.lazy
        failed: dict[int, Exception] = {}
        try:
            with engine.begin() as conn:
                if len(group) == 1:
                    group[0].statements(conn)
                else:
                    for n, queued in enumerate(group):
                        try:
                            with conn.begin_nested():
                                queued.statements(conn)
                        except Exception as exc:  # that commit's own refusal: its alone
                            failed[n] = exc
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
