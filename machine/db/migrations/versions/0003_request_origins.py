"""request origins

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:

    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("origin_request", sa.String(length=300), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_executions_origin_request"), ["origin_request"], unique=False
        )

    with op.batch_alter_table("owed_requests", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("method", sa.String(length=100), nullable=False, server_default="")
        )
        batch_op.alter_column(
            "id",
            existing_type=sa.VARCHAR(length=200),
            type_=sa.String(length=300),
            existing_nullable=False,
        )


def downgrade() -> None:

    with op.batch_alter_table("owed_requests", schema=None) as batch_op:
        batch_op.alter_column(
            "id",
            existing_type=sa.String(length=300),
            type_=sa.VARCHAR(length=200),
            existing_nullable=False,
        )
        batch_op.drop_column("method")

    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_executions_origin_request"))
        batch_op.drop_column("origin_request")
