"""The trainer's policy: which weights the inference servers serve now, and groups too stale to use.

`policy_state` holds one row per policy name (one, "default", today): the version the trainer
declared last, whether generation is paused for a weight update, and the LoRA adapter (name and
directory) that version's calls are served by. The API writes it; every proxy
reads it at start and polls it, so a proxy that restarts or missed a push converges on its own.

`stale_groups` records each group that was found too old for the trainer (its oldest token came
from a version more than `max_staleness` behind the current one). Such a group is never handed to
a trainer by the stream; it stays in the results, flagged, for off-policy use. Insert-only.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, utcnow

DEFAULT_POLICY = "default"


class PolicyState(Base):
    __tablename__ = "policy_state"

    name: Mapped[str] = mapped_column(String(100), primary_key=True, default=DEFAULT_POLICY)
    version: Mapped[int] = mapped_column(Integer, default=0)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    adapter_name: Mapped[str | None] = mapped_column(String(200), default=None)
    """The LoRA adapter the engines serve this version with (vLLM `lora_name`); None: none."""
    adapter_path: Mapped[str | None] = mapped_column(String(4096), default=None)
    """The adapter's directory, as the engines read it (the API may not share their disk)."""
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class StaleAction:
    WITHHELD = "withheld"
    """Kept out of the stream, available in the results for off-policy use."""
    DROPPED = "dropped"
    """Kept out of the stream, and its unfinished rollouts were cancelled (reason `stale`)."""


class StaleGroup(Base):
    __tablename__ = "stale_groups"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    task_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    action: Mapped[str] = mapped_column(String(16))
    min_version: Mapped[int] = mapped_column(Integer)
    """The oldest policy version among the group's agent tokens."""
    current_version: Mapped[int] = mapped_column(Integer)
    """The policy version when the group was found stale."""
    at: Mapped[datetime] = mapped_column(default=utcnow)
