"""approval links are signed with a server key: the database keeps no token

0006 kept each live link's token in plain text (`token`), so that every answer could hand
the same URL out again; anyone who could read the database could approve paused calls with
it. From 0007 the URL carries `<id>-<mac>`, the mac an HMAC under a key kept outside the
database (LOCKGATE_SIGNING_KEYS, or on SQLite a key file next to the database file), and
the server recomputes it from the row. So `token` is dropped, and `token_hash`, which now
just names the row, becomes `id`.

Links minted before this revision stop working, on purpose: the plaintext links of 0006
(the secret is gone with the column) and the hashed links from before 0006 too (they have no
mac, and keeping a second, older kind of credential alive would leave two ways in for one
upgrade's convenience). Their rows are no longer handed out (`link` cleared), so a call
still waiting gets a new, signed link in its next answer (the client's next `resume`, or
the next listing); a click on an old link is told the link is not valid and to ask for a
new one. The rows stay until they expire and are purged.

Downgrading keeps the rows but not the links: a 0006 server finds no token to hand out and
no sha256 that matches, so every call's next answer mints a new link.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE approval_tokens SET link = NULL")
    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.drop_column("token")
        batch_op.alter_column(
            "token_hash",
            new_column_name="id",
            existing_type=sa.String(length=64),
            existing_nullable=False,
        )


def downgrade() -> None:
    op.execute("UPDATE approval_tokens SET link = NULL")
    with op.batch_alter_table("approval_tokens", schema=None) as batch_op:
        batch_op.alter_column(
            "id",
            new_column_name="token_hash",
            existing_type=sa.String(length=64),
            existing_nullable=False,
        )
        batch_op.add_column(sa.Column("token", sa.String(length=64), nullable=True))
