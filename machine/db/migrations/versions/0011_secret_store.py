"""the secret store: values encrypted at rest, global or per principal, optionally bound to
one source

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lockgate.machine.db.types import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=True),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_secrets_principal_id", "secrets", ["principal_id"])
    op.create_index("ix_secrets_name", "secrets", ["name"])


def downgrade() -> None:
    op.drop_index("ix_secrets_name", table_name="secrets")
    op.drop_index("ix_secrets_principal_id", table_name="secrets")
    op.drop_table("secrets")
