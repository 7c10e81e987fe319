"""Alembic environment: the engine is handed over by `machine.db.migrate`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from lockgate.machine.db.schema import metadata

engine = context.config.attributes.get("engine")
if not isinstance(engine, Engine):  # pragma: no cover - only via machine.db.migrate
    raise RuntimeError("run migrations with `lockgate db upgrade`")

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
