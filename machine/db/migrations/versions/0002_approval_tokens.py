"""approval tokens

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lockgate.machine.db.types import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "approval_tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("execution_id", sa.String(length=64), nullable=False),
        sa.Column("call_seq", sa.Integer(), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["executions.id"],
        ),
        sa.PrimaryKeyConstraint("token_hash"),
    )
    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_approval_tokens_execution_id"), ["execution_id"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_approval_tokens_execution_id"))

    op.drop_table("approval_tokens")
