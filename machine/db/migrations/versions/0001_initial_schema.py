"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lockgate.machine.db.types import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "executions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("code", sa.Text(), nullable=False),
        sa.Column("snapshot", sa.LargeBinary(), nullable=True),
        sa.Column("runtime_version", sa.String(length=32), nullable=True),
        sa.Column("calls_made", sa.Integer(), nullable=False),
        sa.Column("snapshot_call", sa.Integer(), nullable=True),
        sa.Column("deadline", UTCDateTime(), nullable=True),
        sa.Column("logs", sa.Text(), server_default="", nullable=False),
        sa.Column("outcome", sa.JSON(), nullable=True),
        sa.Column("what_ran", sa.JSON(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_executions_live",
            ["status", "owner"],
            unique=False,
            sqlite_where=sa.text("status IN ('pending', 'running', 'waiting_for_interaction')"),
            postgresql_where=sa.text("status IN ('pending', 'running', 'waiting_for_interaction')"),
        )
        batch_op.create_index(
            "ix_executions_principal", ["principal_id", "created_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_executions_session_id"), ["session_id"], unique=False)

    op.create_table(
        "instances",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("incarnation", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("lease_until", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("incarnation"),
    )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_instances_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_instances_status"), ["status"], unique=False)

    op.create_table(
        "owed_requests",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("incarnation", sa.Integer(), nullable=False),
        sa.Column("execution_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("owed_requests", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_owed_requests_session_id"), ["session_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_owed_requests_status"), ["status"], unique=False)

    op.create_table(
        "principals",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("protocol_version", sa.String(length=32), nullable=False),
        sa.Column("client_info", sa.JSON(), nullable=True),
        sa.Column("capabilities", sa.JSON(), nullable=True),
        sa.Column("incarnation", sa.Integer(), nullable=False),
        sa.Column("last_activity", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sessions_principal_id"), ["principal_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_sessions_status"), ["status"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["principal_id"],
            ["principals.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_api_keys_principal_id"), ["principal_id"], unique=False
        )

    op.create_table(
        "tool_calls",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("execution_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("idempotent", sa.Boolean(), nullable=False),
        sa.Column("arguments", sa.JSON(), nullable=True),
        sa.Column("arguments_preview", sa.JSON(), nullable=True),
        sa.Column("decision", sa.JSON(), nullable=True),
        sa.Column("decided_at", UTCDateTime(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["executions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_tool_calls_execution_id"), ["execution_id"], unique=False
        )

    op.create_table(
        "transition_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("machine", sa.String(length=32), nullable=False),
        sa.Column("record_id", sa.String(length=200), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("dest", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("transition_log", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_transition_log_record_id"), ["record_id"], unique=False
        )


def downgrade() -> None:
    op.drop_table("transition_log")

    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tool_calls_execution_id"))

    op.drop_table("tool_calls")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_principal_id"))

    op.drop_table("api_keys")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sessions_status"))
        batch_op.drop_index(batch_op.f("ix_sessions_principal_id"))

    op.drop_table("sessions")
    op.drop_table("principals")
    with op.batch_alter_table("owed_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_owed_requests_status"))
        batch_op.drop_index(batch_op.f("ix_owed_requests_session_id"))

    op.drop_table("owed_requests")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instances_status"))
        batch_op.drop_index(batch_op.f("ix_instances_name"))

    op.drop_table("instances")
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_executions_session_id"))
        batch_op.drop_index("ix_executions_principal")
        batch_op.drop_index(
            "ix_executions_live",
            sqlite_where=sa.text("status IN ('pending', 'running', 'waiting_for_interaction')"),
            postgresql_where=sa.text("status IN ('pending', 'running', 'waiting_for_interaction')"),
        )

    op.drop_table("executions")
