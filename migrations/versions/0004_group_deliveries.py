"""group_deliveries: leases and acknowledgements of complete groups handed to trainers

Revision ID: 0004_group_deliveries
Revises: 0003
Create Date: 2026-12-03 01:20:00

One row per (job, task) group once it has been leased; the composite primary key is the conflict
target of the atomic claim (`INSERT ... ON CONFLICT DO UPDATE WHERE lease expired`). A new table,
so the upgrade takes no lock on the hot tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_group_deliveries"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_deliveries",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("task_index", sa.Integer(), nullable=False),
        sa.Column("consumer", sa.String(length=200), nullable=False),
        sa.Column("delivery_count", sa.Integer(), nullable=False),
        sa.Column("leased_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_group_deliveries_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "task_index", name=op.f("pk_group_deliveries")),
    )


def downgrade() -> None:
    op.drop_table("group_deliveries")
