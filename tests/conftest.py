"""Shared fixtures: real databases (a SQLite file, a real PostgreSQL server) and runtimes."""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import inspect

# Imported here, not when first needed: mutation testing forks each mutant's session from a
# process that imported this file, so they are imported once, not once per mutant.
from lockgate.machine.db import migrate
from lockgate.machine.db.connect import open_engine
from lockgate.simulation.invariants import trace_problems
from tests.support.canary import CANARY, SIGNING_KEY
from tests.support.postgres import PostgresServer, find_bin_dir
from tests.support.programs import missing


def pytest_configure(config: pytest.Config) -> None:
    """Under mutation testing, each mutant's tests are a pytest session of their own, in a
    child forked from a process that holds the whole suite imported: the objects inherited
    are left out of the garbage collector's passes (pytest's own collection at the end of
    each session took 0.16 s of scanning them, a third of a quick mutant's run)."""
    if "MUTANT_UNDER_TEST" in os.environ:
        gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under mutation testing, a mutant's tests run fastest first. mutmut runs them with
    `-x` and in no set order, so a mutant one quick test kills was often kept waiting for
    slower tests first; its record of each test's duration (from its clean run) is in
    its state, in this very process."""
    if "MUTANT_UNDER_TEST" not in os.environ:
        return
    try:
        from mutmut.state import state
    except ImportError:
        return
    durations = state().duration_by_test
    if durations:
        items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


@pytest.fixture(scope="session", autouse=True)
def catalogues_of_this_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tools built from OpenAPI documents are kept in a folder of this run's (the
    servers the tests start inherit it), never in the user's cache, where an earlier run's
    would serve this one's sources."""
    folder = tmp_path_factory.mktemp("catalogues")
    before = os.environ.get("LOCKGATE_CATALOGUE_DIR")
    os.environ["LOCKGATE_CATALOGUE_DIR"] = str(folder)
    yield folder
    if before is None:
        del os.environ["LOCKGATE_CATALOGUE_DIR"]
    else:
        os.environ["LOCKGATE_CATALOGUE_DIR"] = before


@pytest.fixture(autouse=True)
def traces_follow_the_model(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test, each database it used (its `database_url`, and SQLite files under
    its tmp_path, where real-process tests put theirs) holds only steps the model allows,
    fences and joint steps included: what the suite makes the code do is checked against
    the model, not only what the simulator does. `@pytest.mark.illegal_trace` marks a test
    that plants a bug on purpose."""
    urls: list[str] = []
    if "database_url" in request.fixturenames:
        urls.append(str(request.getfixturevalue("database_url")))
    folder: Path | None = None
    if "tmp_path" in request.fixturenames:
        folder = request.getfixturevalue("tmp_path")
    yield
    if request.node.get_closest_marker("illegal_trace") is not None:
        return
    if folder is not None:
        urls += [f"sqlite:///{path}" for path in sorted(folder.rglob("*.db"))]
    for url in dict.fromkeys(urls):
        problems = _trace_problems_of(url)
        if problems:
            listed = "\n  ".join(problems[:20])
            pytest.fail(f"the transition log of {url} disagrees with the model:\n  {listed}")


def _trace_problems_of(url: str) -> list[str]:
    engine = open_engine(url)
    try:
        try:
            columns = {c["name"] for c in inspect(engine).get_columns("transition_log")}
        except Exception:  # not a Lockgate database, or not migrated: nothing to check
            return []
        if "txn" not in columns:
            return []  # an older schema a migration test left behind
        return trace_problems(engine)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        missing("PostgreSQL's server programs (initdb, postgres)", "postgresql")
    server = PostgresServer(bin_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_template(postgres_server: PostgresServer) -> str:
    name = postgres_server.create_database()
    engine = open_engine(postgres_server.url(name))
    migrate.upgrade(engine)
    engine.dispose()
    return name


def _migrations_digest() -> str:
    """What the migrated schema is made of: the migration scripts, what they import of the
    store (its column types, its schema, the upgrade itself), and the versions of the
    libraries that turn them into SQL."""
    digest = hashlib.sha256(
        f"{sqlalchemy.__version__} {importlib.metadata.version('alembic')}".encode()
    )
    store = Path(migrate.__file__).parent
    made_of = [store / "migrate.py", store / "schema.py", store / "types.py"]
    for script in [*made_of, *sorted((store / "migrations").rglob("*.py"))]:
        digest.update(script.relative_to(store).as_posix().encode() + script.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, as `postgres_template` is: each test's database starts as a
    copy (the migrations themselves are tested in test_store; running all of them again
    cost most of a short test's setup). Kept between test processes, named by what it is
    migrated from: a test process made one of its own at each start, and mutation testing
    starts one per mutant (0.3 s of each). Kept in this checkout's virtualenv, never a folder
    other users can write to (a file planted there would be every test's database)."""
    kept = Path(sys.prefix) / "lockgate-test-templates" / f"{_migrations_digest()}.db"
    if kept.exists():
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    engine = open_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    engine.dispose()  # the last connection closing checkpoints the WAL into the file
    # Another test process may be making it at the same moment: each renames a whole file.
    shutil.copyfile(path, made := kept.with_suffix(f".{os.getpid()}.tmp"))
    os.replace(made, kept)
    return kept


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, migrated database of each kind; a test using it runs on both."""
    if request.param == "sqlite":
        migrated: Path = request.getfixturevalue("sqlite_template")
        shutil.copyfile(migrated, tmp_path / "lockgate.db")
        return f"sqlite:///{tmp_path / 'lockgate.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    template: str = request.getfixturevalue("postgres_template")
    return server.url(server.create_database(template=template))


@pytest.fixture
def make_runtime(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Build runtimes on the test's database (several = several instances or restarts)."""
    from lockgate.machine.runtime import Runtime
    from lockgate.machine.secrets import StaticSecrets
    from lockgate.machine.settings import Settings
    from lockgate.machine.tools.notes import NotesSource

    made: list[Runtime] = []

    def build(**overrides: Any) -> Runtime:
        faults = overrides.pop("faults", None)
        clock = overrides.pop("clock", None)
        sources = overrides.pop("sources", None)
        # `secrets=None`: the server's own store (the database's, then the environment).
        secrets = overrides.pop("secrets", StaticSecrets({"notes_token": CANARY}))
        shared = {} if database_url.startswith("sqlite") else {"signing_keys": SIGNING_KEY}
        settings = Settings(
            **{
                "database_url": database_url,
                "notes_dir": tmp_path / "notes",
                "max_duration_secs": 5,
                # The tests accept as the model; the other approval modes' tests say so.
                "approval_mode": "model",
                **shared,
                **overrides,
            }
        )
        extra: dict[str, Any] = {}
        if clock is not None:
            extra["clock"] = clock
        runtime = Runtime.create(
            settings,
            sources=sources if sources is not None else [NotesSource(tmp_path / "notes")],
            secrets=secrets,
            faults=faults,
            **extra,
        )
        made.append(runtime)
        return runtime

    yield build
    for runtime in made:
        runtime.sandbox.close()
        runtime.engine.store.engine.dispose()
