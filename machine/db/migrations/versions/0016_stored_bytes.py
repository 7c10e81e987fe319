"""executions count the bytes they keep (stored_bytes), for each principal's storage budget;
indexes for summing them per principal and for purging the oldest finished executions

Existing rows are measured once here: code, logs, result, snapshot, and their calls'
arguments, previews and results.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# The spec's terminal execution statuses when this revision was written.
_FINISHED = "'completed', 'failed', 'cancelled', 'expired', 'interrupted'"


def upgrade() -> None:
    # Plain ALTER TABLE on both databases (a batch copy of `executions` on SQLite would
    # trip the foreign key of `tool_calls`).
    op.add_column(
        "executions",
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_index(
        "ix_executions_principal_bytes", "executions", ["principal_id", "stored_bytes"]
    )
    op.create_index(
        "ix_executions_finished",
        "executions",
        ["updated_at"],
        sqlite_where=sa.text(f"status IN ({_FINISHED})"),
        postgresql_where=sa.text(f"status IN ({_FINISHED})"),
    )
    postgres = op.get_bind().dialect.name == "postgresql"

    def size(column: str) -> str:
        # JSON is text on SQLite; PostgreSQL measures its text form's bytes.
        if postgres and column not in ("code", "logs", "snapshot"):
            return f"COALESCE(octet_length(CAST({column} AS TEXT)), 0)"
        return f"COALESCE({'octet_length' if postgres else 'length'}({column}), 0)"

    calls = " + ".join(size(c) for c in ("arguments", "arguments_preview", "result"))
    own = " + ".join(size(c) for c in ("code", "logs", "outcome", "snapshot"))
    op.execute(
        f"UPDATE executions SET stored_bytes = {own} + COALESCE(("
        f"SELECT SUM({calls}) FROM tool_calls WHERE tool_calls.execution_id = executions.id"
        "), 0)"
    )


def downgrade() -> None:
    op.drop_index("ix_executions_finished", table_name="executions")
    op.drop_index("ix_executions_principal_bytes", table_name="executions")
    op.drop_column("executions", "stored_bytes")
