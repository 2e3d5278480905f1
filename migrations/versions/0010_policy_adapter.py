"""policy_state.adapter_name / adapter_path: the LoRA adapter a policy version is served by

Revision ID: 0010_policy_adapter
Revises: 0009_llm_calls_partitioned
Create Date: 2026-12-06 03:50:00

A trainer publishes new weights with a version (`POST /v1/policy` with `adapter_path`); proxies
that restart or missed the push load the recorded adapter from here before they serve.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_policy_adapter"
down_revision = "0009_llm_calls_partitioned"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("policy_state", sa.Column("adapter_name", sa.String(200), nullable=True))
    op.add_column("policy_state", sa.Column("adapter_path", sa.String(4096), nullable=True))


def downgrade() -> None:
    op.drop_column("policy_state", "adapter_path")
    op.drop_column("policy_state", "adapter_name")
