"""LLM calls captured by the proxy, token by token.

This is the fastest-growing table (one row per proxied request), so it is insert-only: no foreign
key to check per row, no UPDATE ever, keyed by a call id the proxy generates so a replayed batch is
idempotent. On PostgreSQL the table is range-partitioned by day on `created_at` (migration 0009,
`polar_mq.retention`): retention drops whole days, and the database's key is (id, created_at)
because a partitioned table's key must hold the partition key. The mapping keeps `id` alone as
the identity (ids are unique on their own; SQLite's table is not partitioned).

`purpose` says who made the call: the agent (its calls become training samples) or a judge scoring
the rollout (`llm_judge`; stored for audit, never trained on). It comes from the signed token.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, JsonDoc, PackedFloat32, PackedInt32, utcnow


class LlmCall(Base):
    __tablename__ = "llm_calls"
    __table_args__ = (Index("ix_llm_calls_rollout_seq", "rollout_id", "seq"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    rollout_id: Mapped[uuid.UUID]
    seq: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(200))
    model: Mapped[str | None] = mapped_column(String(200))
    api_type: Mapped[str] = mapped_column(String(30))
    """chat | completions | anthropic_messages | responses | gemini"""
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    policy_version: Mapped[int] = mapped_column(Integer, default=0)
    status_code: Mapped[int] = mapped_column(Integer)
    complete: Mapped[bool] = mapped_column(Boolean, default=True)
    request: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    """The agent's request as it sent it (in its API family's shape)."""
    engine_request: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc, nullable=True)
    """The chat request a translated family's call became (None: `request` was sent as is)."""
    response: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    prompt_ids: Mapped[list[int] | None] = mapped_column(PackedInt32)
    completion_ids: Mapped[list[int] | None] = mapped_column(PackedInt32)
    logprobs: Mapped[list[float] | None] = mapped_column(PackedFloat32)
    finish_reason: Mapped[str | None] = mapped_column(String(30))
    latency_ms: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    purpose: Mapped[str] = mapped_column(String(16), default="agent", server_default="agent")
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    """The rollout attempt that made the call: a restarted rollout builds from its own calls."""
    """agent | judge (see polar_mq.capability.tokens.PURPOSES)"""
    prompt_source: Mapped[str] = mapped_column(String(8), default="chat", server_default="chat")
    """How the engine's prompt was built: `chat` (messages the engine rendered) or `tito` (the
    previous call's prompt + completion ids + the new messages' ids, `polar_mq.proxy.tito`)."""
    tito_fallback: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """Why a call token-in/token-out could have built went the chat way (None: it did not)."""
