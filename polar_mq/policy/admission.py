"""Staleness capacity: how many groups of a job may be generated ahead of the trainer.

A job with `staleness` is created with every rollout `held` (no message sent). Groups are admitted
in task order while

    admitted - stale groups <= (max_staleness + current - base_version + 1) * batch_size

`base_version` is the policy version when the job was submitted, so with `max_staleness` S the
trainer never waits on a group that could not be fresh, and generation never runs more than S
steps ahead of the weights: at version v the trainer has consumed (v - base) batches at most and
(S + 1) more are in flight. Stale groups do not count (they were not accepted; the rule of AReaL's
asynchronous PPO). Admission is re-checked whenever something can change the answer: at submit, on
a policy update, when groups are found stale, and by the sweeper.

The job row is locked while counting, so two admitters (API, sweeper, a lease) cannot both see the
same free capacity and overfill it.
"""

from __future__ import annotations

import uuid

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from polar_mq.lifecycle.admission import release_groups
from polar_mq.models import Job, Rollout, RolloutStatus, StaleGroup
from polar_mq.spec import StoredStaleness, load_spec


def capacity_groups(staleness: StoredStaleness, current_version: int) -> int:
    """Groups the job may have admitted (minus stale ones) at `current_version`."""
    ahead = max(0, current_version - staleness.base_version)
    return (staleness.max_staleness + ahead + 1) * staleness.batch_size


def admitted_groups(session: Session, job_id: uuid.UUID) -> tuple[int, int]:
    """(groups with at least one rollout past `held`, of which stale)."""
    admitted = session.scalar(
        select(func.count(distinct(Rollout.task_index))).where(
            Rollout.job_id == job_id, Rollout.status != RolloutStatus.HELD
        )
    )
    stale = session.scalar(select(func.count()).where(StaleGroup.job_id == job_id))
    return int(admitted or 0), int(stale or 0)


def admit(session: Session, job_id: uuid.UUID, current_version: int, worker: str = "api") -> int:
    """Admit as many held groups of the job as its capacity allows; the number admitted.

    Their rollouts move `held` → `queued` and their prepare messages go out after commit
    (`lifecycle.admission`).
    """
    job = session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()
    staleness = load_spec(job.spec).staleness if job is not None else None
    if job is None or staleness is None or job.cancelled_at is not None:
        return 0
    admitted, stale = admitted_groups(session, job_id)
    room = capacity_groups(staleness, current_version) - (admitted - stale)
    if room <= 0:
        return 0
    indexes = session.scalars(
        select(Rollout.task_index)
        .where(Rollout.job_id == job_id, Rollout.status == RolloutStatus.HELD)
        .distinct()
        .order_by(Rollout.task_index)
        .limit(room)
    ).all()
    if not indexes:
        return 0
    release_groups(session, job, indexes, current_version, worker)
    return len(indexes)


def jobs_waiting(session: Session) -> list[uuid.UUID]:
    """Jobs with held rollouts (the status index makes this cheap)."""
    return list(
        session.scalars(
            select(Rollout.job_id).where(Rollout.status == RolloutStatus.HELD).distinct()
        ).all()
    )


def admit_all(session: Session, current_version: int, worker: str = "api") -> int:
    """Admit what fits in every job that is waiting for capacity; the groups admitted."""
    return sum(admit(session, job_id, current_version, worker) for job_id in jobs_waiting(session))
