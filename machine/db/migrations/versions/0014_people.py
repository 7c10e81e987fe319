"""people who approve: approvers, their grants, passkeys, enrolment links, signed-in sessions
and sign-in challenges; approval links no longer carry a credential, so their table goes

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lockgate.machine.db.types import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("sign_in", sa.String(length=16), nullable=False),
        sa.Column("issuer", sa.String(length=500), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("issuer", "subject", name="uq_approvers_identity"),
    )
    op.create_table(
        "approver_grants",
        sa.Column("approver_id", sa.String(length=32), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("approver_id", "principal_id"),
    )
    op.create_index("ix_approver_grants_principal_id", "approver_grants", ["principal_id"])
    op.create_table(
        "passkeys",
        sa.Column("id", sa.String(length=1400), nullable=False),
        sa.Column("approver_id", sa.String(length=32), nullable=False),
        sa.Column("public_key", sa.LargeBinary(), nullable=False),
        sa.Column("sign_count", sa.Integer(), nullable=False),
        sa.Column("transports", sa.JSON(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_passkeys_approver_id", "passkeys", ["approver_id"])
    op.create_table(
        "enrolments",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("approver_id", sa.String(length=32), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_enrolments_approver_id", "enrolments", ["approver_id"])
    op.create_table(
        "approver_sessions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("approver_id", sa.String(length=32), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_approver_sessions_approver_id", "approver_sessions", ["approver_id"])
    op.create_index("ix_approver_sessions_status", "approver_sessions", ["status"])
    op.create_table(
        "sign_in_challenges",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # A link names a call now and authorises nothing: the single-use link credentials go.
    op.drop_table("approval_tokens")


def downgrade() -> None:
    op.create_table(
        "approval_tokens",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("execution_id", sa.String(length=64), nullable=False),
        sa.Column("call_seq", sa.Integer(), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
        sa.Column("link", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["execution_id"], ["executions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_approval_tokens_execution_id"), ["execution_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_approval_tokens_link"), ["link"], unique=True)
    for table in ("sign_in_challenges", "approver_sessions", "enrolments", "passkeys"):
        op.drop_table(table)
    op.drop_index("ix_approver_grants_principal_id", table_name="approver_grants")
    op.drop_table("approver_grants")
    op.drop_table("approvers")
