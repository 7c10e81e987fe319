"""tool-policy rules stored in the database, global or per principal

`lockgate policy add` writes a rule every instance reads (a principal's rules and the global
ones, weighed with LOCKGATE_POLICY's: most restrictive wins).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lockgate.machine.db.types import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policy_rules",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=True),
        sa.Column("pattern", sa.String(length=300), nullable=False),
        sa.Column("condition", sa.String(length=16), nullable=True),
        sa.Column("decision", sa.String(length=32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_policy_rules_principal_id", "policy_rules", ["principal_id"])


def downgrade() -> None:
    op.drop_index("ix_policy_rules_principal_id", table_name="policy_rules")
    op.drop_table("policy_rules")
