"""one principal's and one session's live work read through partial indexes

The admission limits read a principal's live executions on every `execute`, and the session
lease counts a session's; through `ix_executions_principal` and `ix_executions_session_id`
those reads walked the principal's or session's whole history. These indexes hold live rows
only (the live index's condition), so the reads cost what is live.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: The live index's condition (schema.py), as the revision that adds these wrote it.
LIVE = "status IN ('pending', 'running', 'waiting_for_interaction')"


def upgrade() -> None:
    op.create_index(
        "ix_executions_live_principal",
        "executions",
        ["principal_id", "status"],
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )
    op.create_index(
        "ix_executions_live_session",
        "executions",
        ["session_id"],
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_executions_live_session", table_name="executions")
    op.drop_index("ix_executions_live_principal", table_name="executions")
