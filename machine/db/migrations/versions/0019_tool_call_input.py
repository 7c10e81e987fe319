"""a tool call whose tool asked its user for values keeps its questions and the answers so
far (`input`), so the answers can arrive at any instance, after any restart, one at a time,
and the call is sent again with every one of them

Existing rows: none (no call asked before).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


# No batch mode (as 0008 and 0018): on SQLite it would rebuild `tool_calls`.


def upgrade() -> None:
    op.add_column("tool_calls", sa.Column("input", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("tool_calls", "input")
