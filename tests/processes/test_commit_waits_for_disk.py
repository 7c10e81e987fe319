"""Which commits wait for the disk (`TransitionSpec.waits_for_disk`): an MCP request's own
bookkeeping (its owed entry and answer, its session's activity and the log level its client
set) does not, everything else does. Seen from the outside on SQLite (the fsyncs of a real
process, under strace; a commit that did not wait still survives the process's SIGKILL),
and on PostgreSQL by what the transaction asks of the server."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlmodel import select

from bench.counting import fsyncs_between_markers
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import Instance
from lockgate.machine.db.store import SqlStore
from lockgate.spec import MACHINES
from tests.support.procs.one_commit import instance_row
from tests.support.programs import require

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_request_bookkeeping_skips_the_wait() -> None:
    lazy = {
        f"{name}.{t.event}"
        for name, spec in MACHINES.items()
        for t in spec.transitions
        if not t.waits_for_disk
    }
    assert lazy == {
        "session.begin_request",
        "session.end_request",
        "session.set_log_level",
        "owed_request.answer",
    }
    created_lazily = {name for name, spec in MACHINES.items() if not spec.creation_waits_for_disk}
    assert created_lazily == {"owed_request"}


def migrated_sqlite(folder: Path) -> str:
    url = f"sqlite:///{folder / 'lockgate.db'}"
    engine = open_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return url


def one_commit(url: str, mode: str, end: str, trace: Path | None = None) -> int:
    command = [sys.executable, "-m", "tests.support.procs.one_commit", url, mode, end]
    if trace is not None:
        strace = require("strace", "strace")  # it counts the fsyncs
        command = [strace, "-f", "-qq", "-e", "trace=fsync,fdatasync,newfstatat,stat",
                   "-o", str(trace), *command]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode


@pytest.mark.parametrize(("mode", "fsyncs"), [("wait", 1), ("lazy", 0)])
def test_a_commit_that_does_not_wait_makes_no_fsync_on_sqlite(
    tmp_path: Path, mode: str, fsyncs: int
) -> None:
    url = migrated_sqlite(tmp_path)
    trace = tmp_path / "strace.log"
    assert one_commit(url, mode, "exit", trace) == 0
    assert fsyncs_between_markers(trace.read_text()) == fsyncs


def test_a_commit_that_did_not_wait_survives_the_process_s_sigkill(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    assert one_commit(url, "lazy", "kill") == -signal.SIGKILL
    engine = open_engine(url)
    try:
        store = SqlStore(engine)
        with store.session() as s:
            names = sorted(row.name for row in s.exec(select(Instance)))
    finally:
        engine.dispose()
    assert names == ["measured", "warm-up"]


@pytest.mark.postgres
def test_postgresql_is_asked_not_to_wait_only_for_such_a_commit(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite is seen from the outside above")
    engine = open_engine(database_url)  # (a copy of the migrated template)
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: sent.append(str(a[2])))
    try:
        store = SqlStore(engine)
        store.commit((), (instance_row("waits"),))
        waited = list(sent)
        sent.clear()
        store.commit((), (instance_row("lazy"),), wait_for_disk=False)
        assert not any("synchronous_commit" in statement for statement in waited)
        assert sent[0] == "SET LOCAL synchronous_commit TO off"
        sent.clear()
        store.commit((), (instance_row("waits again"),))
        assert not any("synchronous_commit" in statement for statement in sent)
    finally:
        engine.dispose()
