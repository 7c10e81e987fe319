"""Creating and dropping whole PostgreSQL databases, for runs that each need a fresh one.

The real-process simulation runs several-instance scenarios only on a database server (on
SQLite a stalled process's transaction would lock every other instance out of the file), and
each run must start from an empty database. This is administration on a server URL, not the
store's SQL: it lives here because `machine/db/` is the only code that speaks SQL at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url


def _server_url(admin_url: str) -> str:
    """The URL psycopg takes (SQLAlchemy's `postgresql+psycopg://` spelling accepted)."""
    url = make_url(admin_url)
    if not url.drivername.startswith("postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {url.drivername}://…")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def fresh_databases(admin_url: str, prefix: str = "lockgate_sim") -> Iterator[Callable[[], str]]:
    """A factory of new, empty databases on the server `admin_url` connects to (as a role
    allowed to create databases); every database it made is dropped on exit."""
    server = _server_url(admin_url)
    try:  # fail here, with a clear message, rather than in the middle of the first run
        psycopg.connect(server, autocommit=True, connect_timeout=10).close()
    except psycopg.Error as exc:
        raise ConnectionError(f"cannot reach the PostgreSQL server: {exc}".strip()) from None
    made: list[str] = []

    def create() -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        return make_url(server).set(database=name).render_as_string(hide_password=False)

    try:
        yield create
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            for name in made:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
