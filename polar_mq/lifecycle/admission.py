"""Admission: held rollouts of a staleness-controlled job become queued, a group at a time.

How many groups may go is the policy's decision (`polar_mq.policy.admission`); this is the
transition itself: a conditional UPDATE `held -> queued` (a group admitted by a concurrent caller
is not admitted twice), one `admitted` event per rollout, and the prepare messages after commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import defer_publish
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Job, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.spec import load_spec


def release_groups(
    session: Session, job: Job, indexes: Sequence[int], current_version: int, worker: str
) -> None:
    """Move the held rollouts of groups `indexes` of `job` to `queued` and send them to prepare."""
    rows = session.execute(
        update(Rollout)
        .where(
            Rollout.job_id == job.id,
            Rollout.task_index.in_(indexes),
            Rollout.status == RolloutStatus.HELD,
        )
        .values(status=RolloutStatus.QUEUED)
        .returning(Rollout.id, Rollout.attempt)
    ).all()
    now = utcnow()
    spec = load_spec(job.spec)
    pool = spec.pool
    session.execute(
        insert(Event),
        [
            {
                "job_id": job.id, "rollout_id": row.id, "stage": Stage.PREPARE.value,
                "kind": EventKind.ADMITTED, "attempt": row.attempt, "worker": worker, "at": now,
                "detail": {"policy_version": current_version},
            }
            for row in rows
        ],
    )  # fmt: skip
    priority = spec.priority
    for row in rows:
        message = StageMessage(Stage.PREPARE, row.id, pool, attempt=row.attempt, priority=priority)
        defer_publish(session, message)
