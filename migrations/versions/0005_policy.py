"""policy_state (the trainer's current policy version, paused or not) and stale_groups

Revision ID: 0005_policy
Revises: 0004_group_deliveries
Create Date: 2026-12-03 05:40:00

Two new tables, so the upgrade takes no lock on the hot ones. Rollouts gain a `held` status
(created, waiting for staleness capacity) that needs no schema change: status is a string.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_policy"
down_revision = "0004_group_deliveries"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policy_state",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_policy_state")),
    )
    op.create_table(
        "stale_groups",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("task_index", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("min_version", sa.Integer(), nullable=False),
        sa.Column("current_version", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_stale_groups_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "task_index", name=op.f("pk_stale_groups")),
    )


def downgrade() -> None:
    op.drop_table("stale_groups")
    op.drop_table("policy_state")
