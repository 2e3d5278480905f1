"""tenants: API keys get a tenant, scopes and quota overrides; jobs get a tenant

Revision ID: 0008_tenants
Revises: 0007_rollout_artifacts
Create Date: 2026-12-03 16:00:00

Keys and jobs that existed before tenants move to the `admin` tenant, and the keys get every scope
(including `admin`), so every client keeps the access it had. Idempotency keys become unique per
tenant: two tenants using the same key must get two jobs, never each other's. A constant server
default makes the new NOT NULL columns metadata-only on PostgreSQL; the jobs table is small (one
row per submission), so its index and constraint swap are quick.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_tenants"
down_revision = "0007_rollout_artifacts"
branch_labels = None
depends_on = None

ALL_SCOPES = "jobs:read,jobs:write,policy:write,admin"


def upgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tenant", sa.String(length=64), server_default="admin", nullable=False)
        )
        batch_op.add_column(
            sa.Column("scopes", sa.String(length=200), server_default=ALL_SCOPES, nullable=False)
        )
        batch_op.add_column(sa.Column("max_rollouts_per_request", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_rollouts_in_flight", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_tokens_per_rollout", sa.Integer(), nullable=True))
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        # New keys always name their scopes: only the migrated ones get them all.
        batch_op.alter_column("scopes", server_default=None)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tenant", sa.String(length=64), server_default="admin", nullable=False)
        )
        batch_op.create_index(batch_op.f("ix_jobs_tenant"), ["tenant"], unique=False)
        batch_op.drop_constraint(batch_op.f("uq_jobs_idempotency_key"), type_="unique")
        batch_op.create_unique_constraint(
            "uq_jobs_tenant_idempotency_key", ["tenant", "idempotency_key"]
        )


def downgrade() -> None:
    # Refuses (unique violation) when two tenants used the same idempotency key: decide first.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("uq_jobs_tenant_idempotency_key", type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_jobs_idempotency_key"), ["idempotency_key"]
        )
        batch_op.drop_index(batch_op.f("ix_jobs_tenant"))
        batch_op.drop_column("tenant")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("max_tokens_per_rollout")
        batch_op.drop_column("max_rollouts_in_flight")
        batch_op.drop_column("max_rollouts_per_request")
        batch_op.drop_column("scopes")
        batch_op.drop_column("tenant")
