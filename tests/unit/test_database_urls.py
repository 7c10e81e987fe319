"""Which file a database URL keeps its data in: what the server keeps next to it (the approval
signing key file of a SQLite deployment) follows it, and an in-memory or PostgreSQL database
has none; a database behind this version is refused with what to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockgate.machine.db.connect import open_engine, sqlite_file
from lockgate.machine.db.migrate import DatabaseNotMigrated, MigrationFailed, upgrade_database


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file::memory:?cache=shared",
        "postgresql://lockgate@127.0.0.1/lockgate",
    ],
)
def test_a_database_kept_in_no_file_has_none(url: str) -> None:
    assert sqlite_file(url) is None


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_database_opens_and_makes_no_folder(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    engine = open_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_file_s_missing_folders_are_made(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path}/data/lockgate/lockgate.db")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    finally:
        engine.dispose()
    assert (tmp_path / "data" / "lockgate" / "lockgate.db").is_file()


def test_a_sqlite_file_is_where_the_url_says(tmp_path: Path) -> None:
    assert sqlite_file(f"sqlite:///{tmp_path}/lockgate.db") == tmp_path / "lockgate.db"
    assert sqlite_file("sqlite:///~/lockgate.db") == Path.home() / "lockgate.db"


def test_a_stale_database_is_refused_naming_both_revisions_and_the_command() -> None:
    assert str(DatabaseNotMigrated(None, "0008")) == (
        "The database schema is at revision none but this version needs 0008. Run "
        "`lockgate db upgrade` (PostgreSQL is never migrated automatically)."
    )
    assert str(DatabaseNotMigrated("0007", "0008")).startswith(
        "The database schema is at revision 0007 but this version needs 0008."
    )


def test_a_database_that_cannot_be_reached_is_named_by_the_driver_s_own_words() -> None:
    with pytest.raises(MigrationFailed) as failed:
        upgrade_database("postgresql://lockgate:s3cret@127.0.0.1:1/lockgate")
    assert "Connection refused" in failed.value.reason
    assert "s3cret" not in failed.value.reason
    assert str(failed.value) == failed.value.reason


def test_a_url_of_no_known_kind_is_refused_with_the_forms_that_work() -> None:
    with pytest.raises(MigrationFailed) as failed:
        upgrade_database("nosuchdb://lockgate:s3cret@host/lockgate")
    assert failed.value.reason == (
        "the database URL cannot be used (NoSuchModuleError): it must be sqlite:///<path> or "
        "postgresql://<user>@<host>/<database>"
    )
