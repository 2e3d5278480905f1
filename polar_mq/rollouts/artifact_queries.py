"""Read service behind `/v1/rollouts/{id}/artifacts`: the files an attempt's agent left behind."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.infra.errors import NotFound
from polar_mq.models import Rollout, RolloutArtifact


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    name: str
    attempt: int
    media_type: str
    size: int
    """The file's real size in bytes."""
    truncated: bool
    """True when only the file's tail was kept (`Settings.artifact_max_bytes`)."""
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RolloutArtifacts:
    rollout_id: uuid.UUID
    attempt: int
    artifacts: list[ArtifactRecord]


def _attempt(session: Session, rollout_id: uuid.UUID, attempt: int | None) -> int:
    current = session.scalar(select(Rollout.attempt).where(Rollout.id == rollout_id))
    if current is None:
        raise NotFound("rollout", rollout_id)
    return current if attempt is None else attempt


def list_artifacts(
    session: Session, rollout_id: uuid.UUID, attempt: int | None = None
) -> RolloutArtifacts:
    """The artifacts of one attempt (default: the current one), by name."""
    chosen = _attempt(session, rollout_id, attempt)
    rows = session.execute(
        select(
            RolloutArtifact.name,
            RolloutArtifact.attempt,
            RolloutArtifact.media_type,
            RolloutArtifact.size,
            RolloutArtifact.truncated,
            RolloutArtifact.created_at,
        )
        .where(RolloutArtifact.rollout_id == rollout_id, RolloutArtifact.attempt == chosen)
        .order_by(RolloutArtifact.name)
    )
    return RolloutArtifacts(rollout_id, chosen, [ArtifactRecord(*row) for row in rows])


def artifact_content(
    session: Session, rollout_id: uuid.UUID, name: str, attempt: int | None = None
) -> tuple[bytes, str]:
    """One artifact's stored bytes and media type (NotFound: no such rollout or artifact)."""
    chosen = _attempt(session, rollout_id, attempt)
    row = session.execute(
        select(RolloutArtifact.content, RolloutArtifact.media_type).where(
            RolloutArtifact.rollout_id == rollout_id,
            RolloutArtifact.attempt == chosen,
            RolloutArtifact.name == name,
        )
    ).first()
    if row is None:
        raise NotFound("artifact", f"{name!r} of rollout {rollout_id} attempt {chosen}")
    return bytes(row[0]), str(row[1])
