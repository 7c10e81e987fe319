"""an execution keeps the trace context of the span that started it, so the spans of its
decision and its resume, on any instance and after any restart, continue that trace

Existing rows: none (their later spans start traces of their own).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


# No batch mode (as 0008): on SQLite it rebuilds `executions`, which tool calls point at.


def upgrade() -> None:
    op.add_column("executions", sa.Column("trace_parent", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("executions", "trace_parent")
