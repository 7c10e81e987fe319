"""an execution started by a direct tool's call names the tool, so its answer is the tool's
own (MCP content), as the call made it, wherever and whenever it is read: a task's result
on any instance, after any restart

Existing rows: none (each answers as `execute`, as before).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


# No batch mode (as 0008): on SQLite it rebuilds `executions`, which tool calls point at.


def upgrade() -> None:
    op.add_column("executions", sa.Column("direct_tool", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("executions", "direct_tool")
