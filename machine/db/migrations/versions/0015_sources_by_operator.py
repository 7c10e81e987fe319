"""stored sources say whether the operator added them: only a source a principal added itself
is held to what a principal may reach (its own secrets, public addresses)

Existing rows: a global source is the operator's; a principal's is taken for the principal's
own (the safe reading), except one that runs a command, which only the operator can add.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sources", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("by_operator", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    sources = sa.table(
        "sources",
        sa.column("id", sa.String),
        sa.column("principal_id", sa.String),
        sa.column("config", sa.JSON),
        sa.column("by_operator", sa.Boolean),
    )
    bind = op.get_bind()
    operators = [
        row.id
        for row in bind.execute(sa.select(sources.c.id, sources.c.principal_id, sources.c.config))
        if row.principal_id is None or (isinstance(row.config, dict) and "command" in row.config)
    ]
    for source_id in operators:
        bind.execute(
            sources.update().where(sources.c.id == source_id).values(by_operator=sa.true())
        )


def downgrade() -> None:
    with op.batch_alter_table("sources", schema=None) as batch_op:
        batch_op.drop_column("by_operator")
