"""Alembic, driven from code: `upgrade` applies every migration up to head; and opening a
database ready for this version of the code (`prepare_database`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from lockgate.machine.db.connect import open_engine
from lockgate.machine.settings import Settings

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: The newest migration this code knows. Written here rather than read from the scripts so
#: that a server starting on an up-to-date database never imports Alembic (about a tenth
#: of a second of its boot); `tests/unit/test_store.py` checks it against Alembic's own head.
HEAD_REVISION = "0020"


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None before the first migration): read from
    Alembic's own table, as Alembic's `MigrationContext` reads it, without importing
    Alembic (whether the table exists, then its row)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        found = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        return None if found is None else str(found)


def head_revision() -> str:
    """The newest migration this code knows."""
    return HEAD_REVISION


def upgrade_if_behind(engine: Engine) -> None:
    """Migrate only when the schema is behind: a started process only reads its revision."""
    if current_revision(engine) != HEAD_REVISION:
        upgrade(engine)


class DatabaseNotMigrated(RuntimeError):
    def __init__(self, current: str | None, head: str | None) -> None:
        super().__init__(
            f"The database schema is at revision {current or 'none'} but this version needs "
            f"{head}. Run `lockgate db upgrade` (PostgreSQL is never migrated automatically)."
        )


def prepare_database(settings: Settings, engine: Engine | None = None) -> Engine:
    """Open the database (or take `engine`, already open on it); migrate the embedded
    SQLite default, refuse a stale PostgreSQL."""
    engine = engine or open_engine(settings.database_url)
    if settings.is_sqlite:
        upgrade_if_behind(engine)
    else:
        current, head = current_revision(engine), head_revision()
        if current != head:
            engine.dispose()
            raise DatabaseNotMigrated(current, head)
    return engine


class MigrationFailed(RuntimeError):
    """The database could not be reached or migrated; `reason` is the driver's own message
    (which names the host and what went wrong, never the password)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def upgrade_database(url: str) -> str | None:
    """`lockgate db upgrade`: apply every migration to the database at `url`; returns the
    revision it is at then."""
    try:
        engine = open_engine(url)
        upgrade(engine)
        return current_revision(engine)
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        if orig is not None:
            reason = str(orig)  # the driver's words: the host and what went wrong
        else:
            # SQLAlchemy's own text may quote the URL, password included: name the kind only.
            reason = (
                f"the database URL cannot be used ({type(exc).__name__}): it must be "
                "sqlite:///<path> or postgresql://<user>@<host>/<database>"
            )
        raise MigrationFailed(reason.strip()) from None
