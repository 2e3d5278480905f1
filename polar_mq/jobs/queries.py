"""Read services behind the job status and list endpoints, and the helpers results.py shares.

Every function takes a Session and returns plain frozen dataclasses: the API serializes them with
orjson straight from here, and FastAPI derives the OpenAPI schema from the same classes, so the
documented shape cannot drift from the served one. Counts are aggregated in SQL. Pages use keyset
cursors, opaque base64 strings. Results by group live in `jobs/results.py`.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from polar_mq.infra.errors import NotFound
from polar_mq.jobs.cursors import decode_cursor, encode_cursor
from polar_mq.jobs.early_stop import stop_status
from polar_mq.jobs.failures import job_errors
from polar_mq.jobs.job_state import RolloutCounts, job_state, outcome_columns
from polar_mq.jobs.read_models import (
    JobPage,
    JobStatus,
    JobSummary,
    StageCount,
    StalenessStatus,
    record,
)
from polar_mq.jobs.schemas import JobCreate
from polar_mq.lifecycle.completeness import group_query
from polar_mq.lifecycle.stages import STAGE_OF_STATUS, STAGE_STATES
from polar_mq.models import Job, JobTask, Rollout, RolloutStatus, TerminationReason
from polar_mq.policy.admission import admitted_groups, capacity_groups
from polar_mq.policy.state import current_version
from polar_mq.spec import load_spec

MAX_PAGE = 1000

STAGES: tuple[str, ...] = tuple(stage.value for stage in STAGE_STATES)


def clamp_limit(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


def get_job(session: Session, job_id: uuid.UUID) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job", job_id)
    return job


def rollout_totals(session: Session, job_id: uuid.UUID) -> tuple[int, int]:
    """(rollouts, terminal rollouts) of a job."""
    counts = job_counts(session, [job_id]).get(job_id, RolloutCounts())
    return counts.total, counts.terminal


def job_counts(session: Session, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, RolloutCounts]:
    """What `job_state` needs, for several jobs in one query (a job without rollouts is absent)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Rollout.job_id, *outcome_columns())
        .where(Rollout.job_id.in_(job_ids))
        .group_by(Rollout.job_id)
    ).tuples()
    return {row[0]: RolloutCounts.of(row[1:]) for row in rows}


def is_scored(reason: str | None) -> bool:
    return reason not in TerminationReason.INFRASTRUCTURE


def job_status(session: Session, job_id: uuid.UUID) -> JobStatus:
    """Totals, per-stage counts, terminal outcomes, group completion and mean reward of a job."""
    job = get_job(session, job_id)
    rows = session.execute(
        select(
            Rollout.status,
            Rollout.termination_reason,
            func.count(),
            func.count(Rollout.reward),
            func.sum(Rollout.reward),
            func.max(Rollout.finished_at),
        )
        .where(Rollout.job_id == job_id)
        .group_by(Rollout.status, Rollout.termination_reason)
    ).all()
    stages = {stage: {"queued": 0, "running": 0} for stage in STAGES}
    by_status: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    total = terminal = n_scored = held = 0
    reward_sum = 0.0
    last_finish: datetime | None = None
    for status, reason, count, n_rewarded, rewards, finished in rows:
        total += count
        if status in RolloutStatus.TERMINAL:
            terminal += count
            by_status[status] = by_status.get(status, 0) + count
            if reason is not None:
                by_reason[reason] = by_reason.get(reason, 0) + count
            if finished is not None and (last_finish is None or finished > last_finish):
                last_finish = finished
        elif status == RolloutStatus.HELD:
            held += count
        elif status in STAGE_OF_STATUS:
            stage, slot = STAGE_OF_STATUS[status]
            stages[stage][slot] += count
        if n_rewarded and is_scored(reason):
            n_scored += n_rewarded
            reward_sum += float(rewards or 0.0)
    counts = RolloutCounts(
        total,
        terminal,
        by_status.get(RolloutStatus.COMPLETED, 0),
        by_status.get(RolloutStatus.FAILED, 0),
    )
    per_group = group_query(job_id, complete_only=True).subquery()
    groups_complete = session.scalar(select(func.count()).select_from(per_group)) or 0
    return JobStatus(
        job_id=job.id,
        state=job_state(job, counts),
        created_at=job.created_at,
        cancelled_at=job.cancelled_at,
        finished_at=last_finish if total and terminal == total else None,
        n_tasks=job.n_tasks,
        samples_per_task=job.samples_per_task,
        total=total,
        terminal=terminal,
        stages={stage: StageCount(**slots) for stage, slots in stages.items()},
        by_status=by_status,
        by_termination_reason=by_reason,
        groups_complete=int(groups_complete),
        groups_total=job.n_tasks,
        n_scored=n_scored,
        mean_reward=reward_sum / n_scored if n_scored else None,
        idempotency_key=job.idempotency_key,
        priority=load_spec(job.spec).priority,
        spec=job.spec,
        metadata=job.meta,
        held=held,
        staleness=_staleness_status(session, job),
        stop=stop_status(session, job),
        errors=job_errors(session, job.id),
    )


def _staleness_status(session: Session, job: Job) -> StalenessStatus | None:
    staleness = load_spec(job.spec).staleness
    if staleness is None:
        return None
    version = current_version(session)
    admitted, stale = admitted_groups(session, job.id)
    return StalenessStatus(
        max_staleness=staleness.max_staleness,
        batch_size=staleness.batch_size,
        on_stale=staleness.on_stale,
        base_version=staleness.base_version,
        current_version=version,
        capacity_groups=capacity_groups(staleness, version),
        admitted_groups=admitted,
        stale_groups=stale,
    )


def list_jobs(
    session: Session, limit: int = 50, cursor: str | None = None, tenant: str | None = None
) -> JobPage:
    """Jobs newest first, keyset-paged on (created_at, id); only `tenant`'s unless None."""
    limit = clamp_limit(limit)
    query = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    if cursor is not None:
        created_at, job_id = decode_cursor(cursor, (datetime, uuid.UUID))
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(created_at, job_id))
    jobs = list(session.scalars(query))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    counts = job_counts(session, [j.id for j in jobs])
    summaries = []
    for job in jobs:
        job_count = counts.get(job.id, RolloutCounts())
        summaries.append(
            record(
                JobSummary,
                job,
                job_id=job.id,
                state=job_state(job, job_count),
                total=job_count.total,
                terminal=job_count.terminal,
                metadata=job.meta,
            )
        )
    next_cursor = None
    if more:
        last = jobs[-1]
        next_cursor = encode_cursor([last.created_at.isoformat(), str(last.id)])
    return JobPage(summaries, next_cursor)


def same_submission(session: Session, job_id: uuid.UUID, spec: JobCreate, pool: str) -> bool:
    """Whether `spec` asks for exactly the job already stored (an idempotent resubmission)."""
    job = get_job(session, job_id)
    stored_spec = load_spec(job.spec)  # old rows too: upgraded, their defaults filled in
    base_version = stored_spec.staleness.base_version if stored_spec.staleness else 0
    if (
        job.samples_per_task != spec.samples_per_task
        or job.n_tasks != len(spec.tasks)
        or stored_spec != spec.job_spec(pool, base_version)
        or job.meta != spec.metadata
    ):
        return False
    stored: list[dict[str, Any]] = list(
        session.scalars(
            select(JobTask.instance).where(JobTask.job_id == job_id).order_by(JobTask.task_index)
        )
    )
    return stored == spec.tasks
