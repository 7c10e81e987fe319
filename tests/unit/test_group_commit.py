"""Group commit on SQLite (`machine.db.group_commit`): commits that are ready together share
one transaction, and so one fsync; one of them refused fails alone; the group waits for
the disk when any of its commits must."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.group_commit import GroupCommit
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import ApiKey, Instance, Principal
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict
from lockgate.machine.records import Change
from tests.support.polling import wait_for
from tests.support.procs.one_commit import instance_row
from tests.support.sqlite_store import sqlite_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with sqlite_store(tmp_path / "lockgate.db") as store:
        yield store


def committer(store: SqlStore) -> GroupCommit:
    assert isinstance(store.committer, GroupCommit)
    return store.committer


class Statements:
    """The SQL SQLite runs on the store's connections (SQLite's own trace, which sees the
    statements sent past SQLAlchemy too), and how many transactions committed."""

    def __init__(self, store: SqlStore) -> None:
        self.sent: list[str] = []
        self.commits = 0
        store.engine.dispose()  # every connection from now on is a traced one
        event.listen(store.engine, "connect", self._traced)
        event.listen(store.engine, "commit", self._committed)

    def _traced(self, dbapi_connection: Any, _record: object) -> None:
        dbapi_connection.set_trace_callback(self.sent.append)

    def _committed(self, _conn: object) -> None:
        self.commits += 1


def together(store: SqlStore, commits: Sequence[Callable[[], None]]) -> list[BaseException | None]:
    """Run `commits` on threads of their own while the writer is busy, so that all of them
    are queued before any is taken; what each raised (None: it committed)."""
    outcomes: list[BaseException | None] = [None] * len(commits)

    def run(n: int) -> None:
        try:
            commits[n]()
        except BaseException as exc:  # the test reports what each raised, interrupts too
            outcomes[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(commits))]
    with committer(store).writer:
        for thread in threads:
            thread.start()
        wait_for(lambda: committer(store).waiting == len(commits), "every commit queued")
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def names(store: SqlStore) -> set[str]:
    with Session(store.engine) as s:
        return {row.name for row in s.exec(select(Instance))}


def test_commits_ready_together_share_one_transaction(store: SqlStore) -> None:
    seen = Statements(store)
    rows = [instance_row(f"instance-{n}") for n in range(5)]
    outcomes = together(store, [partial(store.commit, (), (row,)) for row in rows])
    assert outcomes == [None] * 5
    assert names(store) == {f"instance-{n}" for n in range(5)}
    assert seen.commits == 1
    # Alone, a commit is a transaction of its own, with no savepoint.
    before = len(seen.sent)
    store.commit((), (instance_row("alone"),))
    alone = seen.sent[before:]
    assert seen.commits == 2 and alone and not any("SAVEPOINT" in s for s in alone)


def test_a_commit_refused_in_a_group_fails_alone(store: SqlStore) -> None:
    stale = instance_row("stale")
    store.commit((), (stale,))
    moved = Change("instance", stale.id, "declare_dead", "live", "dead", 0, {})
    store.commit((moved,))
    seen = Statements(store)
    outcomes = together(
        store,
        [
            lambda: store.commit((), (instance_row("before"),)),
            # Its version is gone: the change touches no row.
            lambda: store.commit((moved,), (instance_row("with-the-stale-change"),)),
            lambda: store.commit((), (instance_row("after"),)),
        ],
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], Conflict)
    assert names(store) == {"stale", "before", "after"}
    assert seen.commits == 1


def test_a_group_waits_for_the_disk_when_one_of_its_commits_must(store: SqlStore) -> None:
    seen = Statements(store)

    def synchronous() -> list[str]:
        return [s for s in seen.sent if s.startswith("PRAGMA synchronous")]

    lazy = [
        partial(store.commit, (), (instance_row(f"lazy-{n}"),), wait_for_disk=False)
        for n in range(2)
    ]
    assert together(store, lazy) == [None, None]
    assert synchronous() == ["PRAGMA synchronous=NORMAL"]
    mixed = [
        lambda: store.commit((), (instance_row("lazy-again"),), wait_for_disk=False),
        lambda: store.commit((), (instance_row("durable"),)),
    ]
    assert together(store, mixed) == [None, None]
    assert synchronous() == ["PRAGMA synchronous=NORMAL", "PRAGMA synchronous=FULL"]
    assert seen.commits == 2


class Interrupt(BaseException):
    """Not an error of the commit: what tears a thread down (as KeyboardInterrupt)."""


class Interrupting:
    def write(self, conn: object) -> None:
        raise Interrupt


def test_a_group_torn_down_loses_no_commit_silently(store: SqlStore) -> None:
    # Whichever thread leads, the interrupt ends the group: every commit either committed
    # (in the next group) or raised to its own caller; the interrupted one never commits.
    outcomes = together(
        store,
        [
            lambda: store.commit((), (instance_row("first"),)),
            lambda: store.commit((), (instance_row("torn"),), writes=[Interrupting()]),
            lambda: store.commit((), (instance_row("last"),)),
        ],
    )
    committed = names(store)
    assert "torn" not in committed and isinstance(outcomes[1], Interrupt)
    for n, name in ((0, "first"), (2, "last")):
        assert (name in committed) == (outcomes[n] is None)
        assert outcomes[n] is None or isinstance(outcomes[n], Interrupt)


def test_a_write_outside_the_lifecycles_queues_for_the_same_writer(store: SqlStore) -> None:
    # An API key (as an approval link) is written in a transaction of its own, but behind
    # the same lock as the store's commits, not in SQLite's sleeping busy handler.
    now = datetime.now(UTC)
    principal = Principal(id="alice", name="alice", created_at=now)
    key = ApiKey(id="k1", principal_id="alice", key_hash="0" * 64, prefix="lg_0", created_at=now)
    adding = threading.Thread(target=store.keys.add, args=(key, principal))
    with committer(store).writer:
        adding.start()
        adding.join(timeout=0.5)
        assert adding.is_alive(), "the key was written while a group held the writer"
        assert store.keys.get("k1") is None
    adding.join(timeout=30)
    assert store.keys.get("k1") is not None


def _commit_in_child(store: SqlStore, go: Any, starting: Any, committed: Any) -> None:
    store.engine.dispose(close=False)  # the parent's pooled connections stay the parent's
    assert go.wait(timeout=30)
    starting.set()
    store.commit((), (instance_row("from-the-child"),))
    committed.set()


def test_another_process_on_the_file_waits_for_the_writer_and_goes_on_when_it_lets_go(
    store: SqlStore,
) -> None:
    # The workers of one `lockgate serve` are processes forked from one parent. While one
    # holds the writer's turn, another's commit waits for it on the file lock (and is woken
    # when it is let go, not by SQLite's busy handler on a timer): also when it inherited the
    # store, and so the lock's descriptor, across the fork.
    store.commit((), (instance_row("before-the-fork"),))  # the lock file is open
    context = multiprocessing.get_context("fork")
    go, starting, committed = context.Event(), context.Event(), context.Event()
    child = context.Process(target=_commit_in_child, args=(store, go, starting, committed))
    child.start()
    try:
        with committer(store).writer:
            go.set()
            assert starting.wait(timeout=30)
            assert not committed.wait(timeout=0.5), "the child committed while the writer was held"
        assert committed.wait(timeout=30)
    finally:
        go.set()
        child.join(timeout=30)
    assert child.exitcode == 0
    assert "from-the-child" in names(store)


def test_a_group_holds_the_file_lock_while_its_statements_run(
    store: SqlStore, tmp_path: Path
) -> None:
    # What other processes on the file wait on: taken around the group's transaction only.
    lock_file = tmp_path / "lockgate.db-writer"
    held_during: list[bool] = []

    def probe(_conn: Any) -> None:
        fd = os.open(lock_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held_during.append(True)
        else:
            held_during.append(False)
        finally:
            os.close(fd)

    committer(store).commit(probe, wait_for_disk=False)
    assert held_during == [True]
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go once the commit is done
    finally:
        os.close(fd)


def test_a_store_let_go_closes_its_lock_file(tmp_path: Path) -> None:
    # A process may open many stores over its life (tests, the CLI's commands): each one's
    # descriptor of the lock file goes with it, so none accumulate.
    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    engine = open_engine(f"sqlite:///{tmp_path / 'lockgate.db'}")
    upgrade(engine)
    try:
        SqlStore(engine).commit((), (instance_row("warm"),))  # the pool's connection opened
        before = open_descriptors()
        for n in range(20):
            SqlStore(engine).commit((), (instance_row(f"instance-{n}"),))
        gc.collect()
        assert open_descriptors() <= before
    finally:
        engine.dispose()


def test_a_commit_the_database_refuses_in_a_group_fails_alone(store: SqlStore) -> None:
    # A unique key refused by SQLite itself, not by the store's version check: the rest of
    # the group still commits, and nothing of the refused commit is kept.
    taken = instance_row("taken")
    store.commit((), (taken,))
    again = instance_row("taken-again")
    again.id = taken.id
    outcomes = together(
        store,
        [
            lambda: store.commit((), (instance_row("before"),)),
            lambda: store.commit((), (instance_row("with-the-duplicate"), again)),
            lambda: store.commit((), (instance_row("after"),)),
        ],
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], IntegrityError)
    assert names(store) == {"taken", "before", "after"}


def test_a_symlink_in_place_of_the_lock_file_is_not_followed(tmp_path: Path) -> None:
    # Whoever can write in the database's folder must not make the server create (or lock)
    # a file elsewhere by planting a link where the lock file goes: the link is refused, and
    # writers wait in SQLite's busy handler instead, as they did before the lock file.
    elsewhere = tmp_path / "elsewhere" / "planted"
    elsewhere.parent.mkdir()
    (tmp_path / "lockgate.db-writer").symlink_to(elsewhere)
    engine = open_engine(f"sqlite:///{tmp_path / 'lockgate.db'}")
    upgrade(engine)
    try:
        store = SqlStore(engine)
        store.commit((), (instance_row("through-the-busy-handler"),))
        assert not elsewhere.exists()
        assert names(store) == {"through-the-busy-handler"}
    finally:
        engine.dispose()


def test_a_disposed_engine_leaves_no_connection_to_the_file_open(tmp_path: Path) -> None:
    # The server disposes its engine before it forks its workers, so that none inherits a
    # connection to the file; the connection the group commits keep between them goes too.
    database = tmp_path / "lockgate.db"

    def open_on_file() -> int:
        fds = Path("/proc/self/fd")
        links = []
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                links.append(os.readlink(fd))
        return sum(1 for link in links if link == str(database))

    engine = open_engine(f"sqlite:///{database}")
    upgrade(engine)
    store = SqlStore(engine)
    store.commit((), (instance_row("before"),))
    engine.dispose()
    assert open_on_file() == 0
    store.commit((), (instance_row("after"),))  # the store goes on: a connection opens again
    assert names(store) == {"before", "after"}
    engine.dispose()
    assert open_on_file() == 0
