"""llm_calls.prompt_source / tito_fallback: how the engine's prompt of a call was built

Revision ID: 0011_prompt_source
Revises: 0010_policy_adapter
Create Date: 2026-12-06 06:30:00

A chat call is sent either as chat messages the engine renders (`chat`) or, under token-in/
token-out, as the previous call's prompt and completion ids plus the rendered new messages
(`tito`, `polar_mq.proxy.tito`). `tito_fallback` says why a call that could have gone token-in
went the chat way (first call, history rewritten, ...). `prefix_merge` reads both: a `tito` call
extends its predecessor by construction. A constant server default and a nullable column: both
metadata-only on PostgreSQL, on every partition of the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_prompt_source"
down_revision = "0010_policy_adapter"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "llm_calls",
        sa.Column("prompt_source", sa.String(8), nullable=False, server_default="chat"),
    )
    op.add_column("llm_calls", sa.Column("tito_fallback", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("tito_fallback")
        batch_op.drop_column("prompt_source")
