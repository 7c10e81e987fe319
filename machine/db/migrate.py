"""Alembic, driven from code: `upgrade` applies every migration up to head."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@functools.cache
def _head() -> str | None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()


def head_revision(engine: Engine | None = None) -> str | None:
    """The newest migration this code knows (read once per process: the files are fixed)."""
    return _head()


def upgrade_if_behind(engine: Engine) -> None:
    """Migrate only when the schema is behind: a started process checks in one query."""
    if current_revision(engine) != head_revision():
        upgrade(engine)
