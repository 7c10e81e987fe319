"""the transition log names each step's transaction and the fence it committed under

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("transition_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("txn", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("fence", sa.String(length=600), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("transition_log", schema=None) as batch_op:
        batch_op.drop_column("fence")
        batch_op.drop_column("txn")
