"""llm_calls.engine_request: the chat request a translated API family's call became

Revision ID: 0006_engine_request
Revises: 0005_policy
Create Date: 2026-12-03 13:00:00

Calls that come in through Anthropic Messages, OpenAI Responses or Gemini are translated to the
engine's chat completions; the row keeps the agent's original request in `request` and what the
engine was sent in `engine_request` (null for chat/completions calls, whose request is sent as
is). A nullable column without a default: a metadata-only change on PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006_engine_request"
down_revision = "0005_policy"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_doc = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.add_column("llm_calls", sa.Column("engine_request", json_doc, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("engine_request")
