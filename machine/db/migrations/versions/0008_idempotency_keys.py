"""execute takes a client idempotency key

A client that lost the answer to an `execute` (a restart, a broken stream, a stateless
2026-07-28 request with no session to collect a report on) re-issues it with the same key
and is attached to the execution it already started. The key is unique per principal, so
the database itself refuses a second execution for it. Existing rows have no key.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


# No batch mode: on SQLite it rebuilds the table (copy, drop, rename), and dropping
# `executions` fails while tool calls and approval links point at its rows. An added
# nullable column and an index need no rebuild on either database; SQLite (3.35+) drops a
# column in place too.


def upgrade() -> None:
    op.add_column("executions", sa.Column("idempotency_key", sa.String(length=128), nullable=True))
    op.create_index(
        "ux_executions_idempotency_key",
        "executions",
        ["principal_id", "idempotency_key"],
        unique=True,
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ux_executions_idempotency_key", table_name="executions")
    op.execute("ALTER TABLE executions DROP COLUMN idempotency_key")
