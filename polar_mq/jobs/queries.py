"""Read services behind the job status, list and results endpoints.

Every function takes a Session and returns plain frozen dataclasses: the API serializes them with
orjson straight from here (token arrays stay Python lists, no per-element validation), and FastAPI
derives the OpenAPI schema from the same classes, so the documented shape cannot drift from the
served one. Counts are aggregated in SQL; a page touches only the rows of its own groups.

Pages use keyset cursors, opaque base64 strings. Complete groups are ordered by when they completed
(the `finished_at` of their last rollout), so a trainer polling with a cursor sees each group once,
as it completes; every group carries its own cursor so a poller can resume from any of them.
Timestamps are taken before commit, so commits can land out of timestamp order: while a job still
runs, a group is only listed once its completion is `RESULTS_SETTLE_S` old, which keeps a cursor
from moving past a group whose commit was still in flight.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, case, func, or_, select, tuple_
from sqlalchemy.orm import Session

from polar_mq.jobs.cursors import decode_cursor, encode_cursor
from polar_mq.jobs.read_models import (
    GroupResult,
    JobPage,
    JobStatus,
    JobSummary,
    NotFound,
    ResultsPage,
    SampleResult,
    StageCount,
    TrajectoryTokens,
    record,
)
from polar_mq.jobs.schemas import JobCreate
from polar_mq.models import (
    Job,
    JobTask,
    Rollout,
    RolloutStatus,
    TerminationReason,
    TrajectorySample,
)
from polar_mq.models.base import utcnow
from polar_mq.workers.transitions import STAGE_OF_STATUS, STAGE_STATES

MAX_PAGE = 1000
RESULTS_SETTLE_S = 1.0

STAGES: tuple[str, ...] = tuple(stage.value for stage in STAGE_STATES)
_TERMINAL = tuple(RolloutStatus.TERMINAL)


def _clamp(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


def _get_job(session: Session, job_id: uuid.UUID) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job", job_id)
    return job


def _state(job: Job, total: int, terminal: int) -> str:
    if job.cancelled_at is not None or job.status == "cancelled":
        return "cancelled"
    return "completed" if total and terminal == total else "running"


def _is_terminal() -> Any:
    return case((Rollout.status.in_(_TERMINAL), 1), else_=0)


def _totals(session: Session, job_id: uuid.UUID) -> tuple[int, int]:
    """(rollouts, terminal rollouts) of a job."""
    total, terminal = (
        session.execute(
            select(func.count(), func.sum(_is_terminal())).where(Rollout.job_id == job_id)
        )
        .tuples()
        .one()
    )
    return int(total), int(terminal or 0)


def _scored(reason: str | None) -> bool:
    return reason not in TerminationReason.INFRASTRUCTURE


def job_status(session: Session, job_id: uuid.UUID) -> JobStatus:
    """Totals, per-stage counts, terminal outcomes, group completion and mean reward of a job."""
    job = _get_job(session, job_id)
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
    total = terminal = n_scored = 0
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
        elif status in STAGE_OF_STATUS:
            stage, slot = STAGE_OF_STATUS[status]
            stages[stage][slot] += count
        if n_rewarded and _scored(reason):
            n_scored += n_rewarded
            reward_sum += float(rewards or 0.0)
    per_group = (
        select(Rollout.task_index)
        .where(Rollout.job_id == job_id)
        .group_by(Rollout.task_index)
        .having(func.sum(_is_terminal()) == func.count())
        .subquery()
    )
    groups_complete = session.scalar(select(func.count()).select_from(per_group)) or 0
    return JobStatus(
        job_id=job.id,
        state=_state(job, total, terminal),
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
        spec=job.spec,
        metadata=job.meta,
    )


def list_jobs(session: Session, limit: int = 50, cursor: str | None = None) -> JobPage:
    """Jobs newest first, keyset-paged on (created_at, id)."""
    limit = _clamp(limit)
    query = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    if cursor is not None:
        created_at, job_id = decode_cursor(cursor, (datetime, uuid.UUID))
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(created_at, job_id))
    jobs = list(session.scalars(query))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    counts: dict[uuid.UUID, tuple[int, int]] = {}
    if jobs:
        rows = session.execute(
            select(Rollout.job_id, func.count(), func.sum(_is_terminal()))
            .where(Rollout.job_id.in_([j.id for j in jobs]))
            .group_by(Rollout.job_id)
        ).tuples()
        counts = {job_id: (total, int(terminal or 0)) for job_id, total, terminal in rows}
    summaries = []
    for job in jobs:
        total, terminal = counts.get(job.id, (0, 0))
        summaries.append(
            record(
                JobSummary,
                job,
                job_id=job.id,
                state=_state(job, total, terminal),
                total=total,
                terminal=terminal,
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
    job = _get_job(session, job_id)
    if (
        job.samples_per_task != spec.samples_per_task
        or job.n_tasks != len(spec.tasks)
        or job.spec != {**spec.stored_spec(), "pool": pool}
        or job.meta != spec.metadata
    ):
        return False
    stored: list[dict[str, Any]] = list(
        session.scalars(
            select(JobTask.instance).where(JobTask.job_id == job_id).order_by(JobTask.task_index)
        )
    )
    return stored == spec.tasks


# --------------------------------------------------------------------------------------------
# Results


def _group_query(job_id: uuid.UUID, complete_only: bool) -> Select[Any]:
    groups = (
        select(
            Rollout.task_index.label("task_index"),
            func.count().label("n"),
            func.sum(_is_terminal()).label("n_terminal"),
            func.max(func.coalesce(Rollout.finished_at, Rollout.created_at)).label("completed_at"),
        )
        .where(Rollout.job_id == job_id)
        .group_by(Rollout.task_index)
    )
    if complete_only:
        groups = groups.having(func.sum(_is_terminal()) == func.count())
    sub = groups.subquery()
    return select(sub.c.task_index, sub.c.n, sub.c.n_terminal, sub.c.completed_at)


def _group_cursor(complete_only: bool, task_index: int, completed_at: datetime) -> str:
    if complete_only:
        return encode_cursor([completed_at.isoformat(), task_index])
    return encode_cursor([task_index])


def job_results(
    session: Session,
    job_id: uuid.UUID,
    cursor: str | None = None,
    limit: int = 100,
    complete_only: bool = True,
    include_trajectories: bool = False,
    settle_s: float | None = None,
) -> ResultsPage:
    """One page of a job's groups with their samples, in completion order (or task order).

    `settle_s` (default RESULTS_SETTLE_S) holds back just-completed groups of a running job.
    """
    job = _get_job(session, job_id)
    limit = _clamp(limit)
    total, terminal = _totals(session, job_id)
    finished = total > 0 and terminal == total
    query = _group_query(job_id, complete_only)
    sub = query.selected_columns
    if complete_only:
        query = query.order_by(sub.completed_at, sub.task_index)
        if not finished:
            settle = timedelta(seconds=RESULTS_SETTLE_S if settle_s is None else settle_s)
            query = query.where(sub.completed_at <= utcnow() - settle)
        if cursor is not None:
            after_at, after_index = decode_cursor(cursor, (datetime, int))
            query = query.where(
                or_(
                    sub.completed_at > after_at,
                    and_(sub.completed_at == after_at, sub.task_index > after_index),
                )
            )
    else:
        query = query.order_by(sub.task_index)
        if cursor is not None:
            (after_index,) = decode_cursor(cursor, (int,))
            query = query.where(sub.task_index > after_index)
    page = session.execute(query.limit(limit + 1)).all()
    more = len(page) > limit
    groups = _groups(session, job_id, page[:limit], complete_only, include_trajectories)
    return ResultsPage(
        job_id=job.id,
        job_state=_state(job, total, terminal),
        job_finished=finished,
        groups=groups,
        next_cursor=groups[-1].cursor if more and groups else None,
    )


def _groups(
    session: Session,
    job_id: uuid.UUID,
    page: Sequence[Any],
    complete_only: bool,
    include_trajectories: bool,
) -> list[GroupResult]:
    indexes = [row.task_index for row in page]
    samples = _samples(session, job_id, indexes, include_trajectories)
    rows = session.execute(
        select(JobTask.task_index, JobTask.instance).where(
            JobTask.job_id == job_id, JobTask.task_index.in_(indexes)
        )
    ).tuples()
    tasks: dict[int, dict[str, Any]] = {index: instance for index, instance in rows}
    groups = []
    for row in page:
        complete = int(row.n_terminal or 0) == int(row.n)
        group_samples = samples.get(row.task_index, [])
        scored = [
            s.reward
            for s in group_samples
            if s.reward is not None and _scored(s.termination_reason)
        ]
        groups.append(
            GroupResult(
                task_index=row.task_index,
                task=tasks.get(row.task_index, {}),
                complete=complete,
                completed_at=row.completed_at if complete else None,
                cursor=_group_cursor(complete_only, row.task_index, row.completed_at),
                n_scored=len(scored),
                mean_reward=sum(scored) / len(scored) if scored else None,
                samples=group_samples,
            )
        )
    return groups


def _samples(
    session: Session, job_id: uuid.UUID, indexes: list[int], include_trajectories: bool
) -> dict[int, list[SampleResult]]:
    if not indexes:
        return {}
    in_page = and_(Rollout.job_id == job_id, Rollout.task_index.in_(indexes))
    tokens: dict[uuid.UUID, list[TrajectoryTokens]] = {}
    if include_trajectories:
        columns = [getattr(TrajectorySample, f.name) for f in fields(TrajectoryTokens)]
        current_attempt = and_(
            Rollout.id == TrajectorySample.rollout_id, Rollout.attempt == TrajectorySample.attempt
        )
        for row in session.execute(
            select(TrajectorySample.rollout_id, *columns)
            .join(Rollout, current_attempt)
            .where(in_page)
            .order_by(TrajectorySample.rollout_id, TrajectorySample.sample_index)
        ):
            tokens.setdefault(row.rollout_id, []).append(record(TrajectoryTokens, row))
    out: dict[int, list[SampleResult]] = {}
    for r in session.scalars(
        select(Rollout).where(in_page).order_by(Rollout.task_index, Rollout.sample_index)
    ):
        trajectories = tokens.get(r.id, []) if include_trajectories else None
        out.setdefault(r.task_index, []).append(
            record(SampleResult, r, rollout_id=r.id, trajectories=trajectories)
        )
    return out


# --------------------------------------------------------------------------------------------
