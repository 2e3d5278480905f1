"""rollout_artifacts: the agent's output log, harness transcript and workspace diff per attempt

Revision ID: 0007_rollout_artifacts
Revises: 0006_engine_request
Create Date: 2026-12-03 16:00:00

A new table, so the upgrade takes no lock on the hot tables. Rows are written with the run-agent
stage's finish; (rollout_id, attempt, name) is unique so a retried stage cannot double them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_rollout_artifacts"
down_revision = "0006_engine_request"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollout_artifacts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True),
        sa.Column("rollout_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("media_type", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollouts.id"],
            name=op.f("fk_rollout_artifacts_rollout_id_rollouts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_artifacts")),
        sa.UniqueConstraint(
            "rollout_id", "attempt", "name", name=op.f("uq_rollout_artifacts_rollout_id")
        ),
    )


def downgrade() -> None:
    op.drop_table("rollout_artifacts")
