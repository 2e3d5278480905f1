"""Creating jobs: rows first, messages after commit.

A job, its tasks and all its rollouts are inserted in one transaction, with one `submitted` event
per rollout; the prepare messages are deferred to after the commit (see lifecycle.outbox). A job
with `staleness` starts with its rollouts `held` and sends only what its capacity admits.
Resubmitting with the same idempotency key returns the existing job instead of a second one; keys
are per tenant. The owner's quota is checked after that lookup and before the first insert, in the
same transaction (see tenants.quotas).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from polar_mq.jobs.effective import stored_job_spec
from polar_mq.jobs.schemas import JobCreate
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import defer_publish
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Job, JobTask, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.policy.admission import admit
from polar_mq.policy.state import current_version
from polar_mq.tenants.quotas import Owner, check_quota


@dataclass(frozen=True, slots=True)
class SubmittedJob:
    job_id: uuid.UUID
    rollout_ids: list[uuid.UUID]
    created: bool


def _existing(session: Session, key: str, tenant: str) -> SubmittedJob | None:
    job_id = session.scalar(select(Job.id).where(Job.idempotency_key == key, Job.tenant == tenant))
    if job_id is None:
        return None
    rollout_ids = session.scalars(
        select(Rollout.id)
        .where(Rollout.job_id == job_id)
        .order_by(Rollout.task_index, Rollout.sample_index)
    ).all()
    return SubmittedJob(job_id, list(rollout_ids), created=False)


def create_job(
    session: Session, spec: JobCreate, default_pool: str, owner: Owner | None = None
) -> SubmittedJob:
    """Insert the job, tasks, rollouts and events; defer the prepare messages to after commit.

    `owner`: the tenant the job belongs to and its quota (default: the `admin` tenant, no limits).
    Raises QuotaExceeded before inserting anything.
    """
    owner = owner or Owner()
    if spec.idempotency_key is not None:
        found = _existing(session, spec.idempotency_key, owner.tenant)
        if found is not None:
            return found
    check_quota(session, owner, spec)
    pool = spec.pool or default_pool
    now = utcnow()
    stored = stored_job_spec(spec, pool)
    version = current_version(session) if spec.staleness is not None else 0
    if spec.staleness is not None:
        stored["staleness"] = {**stored["staleness"], "base_version": version}
    first_status = RolloutStatus.QUEUED if spec.staleness is None else RolloutStatus.HELD
    job = Job(
        id=uuid.uuid4(),
        tenant=owner.tenant,
        idempotency_key=spec.idempotency_key,
        samples_per_task=spec.samples_per_task,
        n_tasks=len(spec.tasks),
        spec=stored,
        meta=spec.metadata,
        created_at=now,
    )
    session.add(job)
    session.flush()
    task_ids = session.scalars(
        insert(JobTask).returning(JobTask.id, sort_by_parameter_order=True),
        [{"job_id": job.id, "task_index": i, "instance": t} for i, t in enumerate(spec.tasks)],
    ).all()
    rollout_ids = [uuid.uuid4() for _ in range(len(task_ids) * spec.samples_per_task)]
    rollouts: list[dict[str, Any]] = [
        {
            "id": rollout_ids[task_index * spec.samples_per_task + sample],
            "job_id": job.id,
            "task_id": task_id,
            "task_index": task_index,
            "sample_index": sample,
            "status": first_status,
            "attempt": 1,
            "created_at": now,
        }
        for task_index, task_id in enumerate(task_ids)
        for sample in range(spec.samples_per_task)
    ]
    session.execute(insert(Rollout), rollouts)
    session.execute(
        insert(Event),
        [
            {
                "job_id": job.id,
                "rollout_id": r["id"],
                "stage": Stage.PREPARE.value,
                "kind": EventKind.SUBMITTED,
                "attempt": 1,
                "at": now,
                "detail": {},
            }
            for r in rollouts
        ],
    )
    if spec.staleness is not None:
        admit(session, job.id, version)  # the rest waits for the trainer's policy updates
    else:
        for rollout_id in rollout_ids:
            message = StageMessage(
                Stage.PREPARE, rollout_id, pool, attempt=1, priority=spec.priority
            )
            defer_publish(session, message)
    return SubmittedJob(job.id, rollout_ids, created=True)
