"""llm_calls.purpose: agent calls (training data) vs judge calls (stored, never trained on)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 17:20:00

A constant server default makes the new column a metadata-only change on PostgreSQL 11+ (no table
rewrite of the fastest-growing table) and fills existing rows with 'agent', which is what every
call logged before judges existed was. SQLite adds a NOT NULL column with a default in place too.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "llm_calls",
        sa.Column("purpose", sa.String(length=16), server_default="agent", nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("purpose")
