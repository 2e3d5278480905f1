"""llm_calls.attempt (calls belong to the attempt that made them) and the sweeper's index

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 18:00:00

`attempt` has a constant server default, so adding it is a metadata-only change on PostgreSQL 11+
(no rewrite of the fastest-growing table); every call logged before it existed was attempt 1's.
The (status, lease_expires_at) index lets the sweeper find expired leases and waiting rollouts
without scanning every rollout ever run.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "llm_calls",
        sa.Column("attempt", sa.Integer(), server_default="1", nullable=False),
    )
    op.create_index("ix_rollouts_status_lease", "rollouts", ["status", "lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_rollouts_status_lease", table_name="rollouts")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("attempt")
