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


def upgrade() -> None:
    op.add_column("executions", sa.Column("direct_tool", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_column("direct_tool")
