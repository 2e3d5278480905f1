"""Files a rollout's agent left behind: its output log, the harness transcript, the workspace diff.

Stored with the run-agent stage's finish (same transaction, so a retried stage never doubles them)
and served by `GET /v1/rollouts/{id}/artifacts`. Each is capped (`Settings.artifact_max_bytes`):
`size` is the file's real size, `truncated` says the stored content is its tail.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, BigIntId, utcnow


class RolloutArtifact(Base):
    """One named file of one attempt; (rollout, attempt, name) is unique."""

    __tablename__ = "rollout_artifacts"
    __table_args__ = (UniqueConstraint("rollout_id", "attempt", "name"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    name: Mapped[str] = mapped_column(String(128))
    media_type: Mapped[str] = mapped_column(String(64), default="text/plain")
    size: Mapped[int] = mapped_column(BigInteger)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
