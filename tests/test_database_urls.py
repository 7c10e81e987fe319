"""Which file a database URL keeps its data in: what the server keeps next to it (the approval
signing key file of a SQLite deployment) follows it, and an in-memory or PostgreSQL database
has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockgate.machine.db.connect import sqlite_file


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


def test_a_sqlite_file_is_where_the_url_says(tmp_path: Path) -> None:
    assert sqlite_file(f"sqlite:///{tmp_path}/lockgate.db") == tmp_path / "lockgate.db"
    assert sqlite_file("sqlite:///~/lockgate.db") == Path.home() / "lockgate.db"
