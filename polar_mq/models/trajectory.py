"""Training samples built from a rollout's LLM calls, and the rewards given to rollouts."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, BigIntId, JsonDoc, PackedFloat32, PackedInt32, utcnow


class TrajectorySample(Base):
    """One training sample; (rollout, attempt, index) is unique so a rebuild cannot double it."""

    __tablename__ = "trajectory_samples"
    __table_args__ = (UniqueConstraint("rollout_id", "attempt", "sample_index"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    sample_index: Mapped[int] = mapped_column(Integer)
    builder: Mapped[str] = mapped_column(String(100))
    prompt_ids: Mapped[list[int]] = mapped_column(PackedInt32)
    response_ids: Mapped[list[int]] = mapped_column(PackedInt32)
    loss_mask: Mapped[list[int]] = mapped_column(PackedInt32)
    logprobs: Mapped[list[float] | None] = mapped_column(PackedFloat32)
    messages: Mapped[list[Any] | None] = mapped_column(JsonDoc)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JsonDoc, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Evaluation(Base):
    """The evaluator's verdict on one attempt of a rollout (unique: evaluated once per attempt)."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("rollout_id", "attempt"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    evaluator: Mapped[str] = mapped_column(String(200))
    reward: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
