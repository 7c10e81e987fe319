"""an approval link is minted once per call and key, and handed out again after that

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Tokens minted before keep working; they have no `link`, so they are never handed out
    # again (the next answer mints the call's one link).
    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("link", sa.String(length=200), nullable=True))
        batch_op.create_index(batch_op.f("ix_approval_tokens_link"), ["link"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_approval_tokens_link"))
        batch_op.drop_column("link")
        batch_op.drop_column("token")
