"""The append-only log of every stage transition; status, timings and audits are read from it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, BigIntId, JsonDoc, utcnow


class EventKind:
    SUBMITTED = "submitted"
    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    SKIPPED = "skipped"
    """A duplicate or stale message that found the stage already claimed or done."""
    CANCELLED = "cancelled"
    RETRIED = "retried"
    """A stage raised unexpectedly and was handed back to its queue with a backoff."""
    REQUEUED = "requeued"
    """The rollout starts over from prepare with attempt+1 (lost worker, failed agent stage)."""
    REPUBLISHED = "republished"
    """The sweeper re-sent the message of a rollout that waited too long with an empty queue."""
    ADMITTED = "admitted"
    """A held rollout was admitted by its job's staleness capacity (its prepare message sent)."""
    STALE = "stale"
    """A group was found too old for the trainer: withheld from the stream, or dropped."""
    RUNTIME_RELEASED = "runtime_released"
    """The rollout's runtime was recycled into the warm pool or destroyed (with its timing)."""
    STOPPED = "stopped"
    """Job-level (no rollout): the job reached `stop.groups` complete groups and stopped."""


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_rollout", "rollout_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID]
    rollout_id: Mapped[uuid.UUID | None]
    stage: Mapped[str] = mapped_column(String(30))
    kind: Mapped[str] = mapped_column(String(30))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    worker: Mapped[str | None] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    detail: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
