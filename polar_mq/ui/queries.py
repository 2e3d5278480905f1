"""Read services of the dashboard's jobs pages: what the REST read services do not already say.

The job status, the groups with their statistics and advantages, and the rollout detail come from
the API's own read services (`polar_mq.jobs.queries`, `polar_mq.jobs.results`,
`polar_mq.rollouts.queries`), so the dashboard never disagrees with what a trainer reads. This
module adds the aggregates only a person looks at: throughput and failures per job for a whole
page of jobs in one query, the slowest and the failed rollouts of a job, and a cheap fingerprint
the live stream compares to decide whether a page must be rendered again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from polar_mq.calls.window import calls_window
from polar_mq.jobs import queries as job_queries
from polar_mq.jobs.read_models import JobSummary
from polar_mq.lifecycle.stages import STAGE_OF_STATUS
from polar_mq.models import (
    Event,
    EventKind,
    Job,
    JobTask,
    LlmCall,
    Rollout,
    RolloutStatus,
    StaleGroup,
    TerminationReason,
)

STAGES = job_queries.STAGES
LISTED_ROLLOUTS = 20
"""Rows in the slowest and failed tables of a job page."""


@dataclass(slots=True)
class JobActivity:
    """One job of the list: its progress per stage, throughput, mean reward and failures."""

    summary: JobSummary
    stages: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per stage: `queued`, `running`."""
    held: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    """Terminal rollouts by termination reason, the agent's `completed` left out."""
    n_scored: int = 0
    reward_sum: float = 0.0
    first_start: datetime | None = None
    last_finish: datetime | None = None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.n_scored if self.n_scored else None

    @property
    def rollouts_per_s(self) -> float | None:
        """Terminal rollouts per second between the first start and the last finish."""
        if self.first_start is None or self.last_finish is None:
            return None
        span = (self.last_finish - self.first_start).total_seconds()
        return self.summary.terminal / span if span > 0 else None


def _empty_stages() -> dict[str, dict[str, int]]:
    return {stage: {"queued": 0, "running": 0} for stage in STAGES}


def jobs_activity(
    session: Session, limit: int, cursor: str | None, tenant: str | None
) -> tuple[list[JobActivity], str | None]:
    """A page of jobs (newest first, as `GET /v1/jobs`) with their activity, in one more query."""
    page = job_queries.list_jobs(session, limit, cursor, tenant)
    out = {j.job_id: JobActivity(j, _empty_stages()) for j in page.jobs}
    if out:
        rows = session.execute(
            select(
                Rollout.job_id,
                Rollout.status,
                Rollout.termination_reason,
                func.count(),
                func.count(Rollout.reward),
                func.sum(Rollout.reward),
                func.min(Rollout.started_at),
                func.max(Rollout.finished_at),
            )
            .where(Rollout.job_id.in_(list(out)))
            .group_by(Rollout.job_id, Rollout.status, Rollout.termination_reason)
        ).tuples()
        for job_id, status, reason, count, n_rewarded, rewards, started, finished in rows:
            _add(out[job_id], status, reason, count, n_rewarded, rewards, started, finished)
    return list(out.values()), page.next_cursor


def _add(
    job: JobActivity,
    status: str,
    reason: str | None,
    count: int,
    n_rewarded: int,
    rewards: float | None,
    started: datetime | None,
    finished: datetime | None,
) -> None:
    if status in STAGE_OF_STATUS:
        stage, slot = STAGE_OF_STATUS[status]
        job.stages[stage][slot] += count
    elif status == RolloutStatus.HELD:
        job.held += count
    elif reason is not None and reason != TerminationReason.COMPLETED:
        job.failures[reason] = job.failures.get(reason, 0) + count
    if n_rewarded and reason not in TerminationReason.INFRASTRUCTURE:
        job.n_scored += n_rewarded
        job.reward_sum += float(rewards or 0.0)
    if started is not None and (job.first_start is None or started < job.first_start):
        job.first_start = started
    if finished is not None and (job.last_finish is None or finished > job.last_finish):
        job.last_finish = finished


@dataclass(frozen=True, slots=True)
class RolloutRow:
    """A rollout in the slowest or failed table of a job page."""

    rollout_id: uuid.UUID
    task_index: int
    sample_index: int
    status: str
    termination_reason: str | None
    attempt: int
    reward: float | None
    duration_s: float | None
    error: str | None


_ROW_COLUMNS = (
    Rollout.id, Rollout.task_index, Rollout.sample_index, Rollout.status,
    Rollout.termination_reason, Rollout.attempt, Rollout.reward, Rollout.started_at,
    Rollout.finished_at, Rollout.error,
)  # fmt: skip


def _rows(session: Session, query: object) -> list[RolloutRow]:
    out = []
    for r in session.execute(query):  # type: ignore[call-overload]
        duration = None
        if r.started_at is not None and r.finished_at is not None:
            duration = (r.finished_at - r.started_at).total_seconds()
        error = r.error[:300] if r.error else None
        out.append(
            RolloutRow(
                r.id,
                r.task_index,
                r.sample_index,
                r.status,
                r.termination_reason,
                r.attempt,
                r.reward,
                duration,
                error,
            )
        )
    return out


def slowest_rollouts(
    session: Session, job_id: uuid.UUID, limit: int = LISTED_ROLLOUTS
) -> list[RolloutRow]:
    """The finished rollouts that took longest from their first claim to their end."""
    took = Rollout.finished_at - Rollout.started_at
    query = (
        select(*_ROW_COLUMNS)
        .where(
            Rollout.job_id == job_id,
            Rollout.finished_at.is_not(None),
            Rollout.started_at.is_not(None),
        )
        .order_by(took.desc())
        .limit(limit)
    )
    return _rows(session, query)


def failed_rollouts(
    session: Session, job_id: uuid.UUID, limit: int = LISTED_ROLLOUTS
) -> list[RolloutRow]:
    """Terminal rollouts that did not end with the agent's `completed`, latest first."""
    query = (
        select(*_ROW_COLUMNS)
        .where(
            Rollout.job_id == job_id,
            Rollout.status.in_(list(RolloutStatus.TERMINAL)),
            Rollout.termination_reason.is_distinct_from(TerminationReason.COMPLETED),
        )
        .order_by(Rollout.finished_at.desc().nulls_last())
        .limit(limit)
    )
    return _rows(session, query)


def finish_times(session: Session, job_id: uuid.UUID) -> list[datetime]:
    """When each finished rollout of the job ended, in order (the progress-over-time chart)."""
    return list(
        session.scalars(
            select(Rollout.finished_at)
            .where(Rollout.job_id == job_id, Rollout.finished_at.is_not(None))
            .order_by(Rollout.finished_at)
        )
    )


def stage_intervals(
    session: Session, job_id: uuid.UUID
) -> list[tuple[str, datetime, datetime | None]]:
    """(stage, first start, last end or None) of each stage of each attempt of the job's
    rollouts, aggregated in the database from the events (read through the rollouts: the events
    are indexed by rollout, not by job). A stage retried in place counts as one run from its
    first start to its end.

    A run with no end event of its own was cut short: an attempt the sweeper or the agent stage
    restarted (closed when the next attempt was requeued), or a rollout cancelled or failed
    elsewhere (closed when the rollout ended). Only a run still under way stays open (None)."""
    ended = Event.kind.in_([EventKind.FINISHED, EventKind.FAILED])
    in_job = Event.rollout_id.in_(select(Rollout.id).where(Rollout.job_id == job_id))
    rows = session.execute(
        select(
            Event.rollout_id,
            Event.attempt,
            Event.stage,
            func.min(Event.at).filter(Event.kind == EventKind.STARTED),
            func.max(Event.at).filter(ended),
        )
        .where(in_job, Event.kind.in_([EventKind.STARTED, EventKind.FINISHED, EventKind.FAILED]))
        .group_by(Event.rollout_id, Event.attempt, Event.stage)
    ).tuples()
    runs = [row for row in rows if row[3] is not None]
    cut = _attempt_ends(session, job_id) if any(row[4] is None for row in runs) else None
    out: list[tuple[str, datetime, datetime | None]] = []
    for rollout_id, attempt, stage, began, end in runs:
        if end is None and cut is not None:
            end = cut.end_of(rollout_id, attempt, began)
        out.append((stage, began, end))
    return out


@dataclass(frozen=True, slots=True)
class _AttemptEnds:
    """When each attempt of a job's rollouts ended without an end event for its running stage."""

    requeued: dict[uuid.UUID, list[tuple[int, datetime]]]
    """Per rollout: (new attempt, when it was requeued)."""
    rollouts: dict[uuid.UUID, tuple[int, datetime | None]]
    """Per rollout: (current attempt, finished_at once terminal)."""

    def end_of(self, rollout_id: uuid.UUID, attempt: int, began: datetime) -> datetime | None:
        later = [at for new, at in self.requeued.get(rollout_id, []) if new > attempt]
        if later:
            return max(min(later), began)
        current, finished_at = self.rollouts.get(rollout_id, (attempt, None))
        if current > attempt:  # restarted, its requeue event not found: closed where it began
            return began
        return None if finished_at is None else max(finished_at, began)


def _attempt_ends(session: Session, job_id: uuid.UUID) -> _AttemptEnds:
    requeued: dict[uuid.UUID, list[tuple[int, datetime]]] = {}
    for rollout_id, attempt, at in session.execute(
        select(Event.rollout_id, Event.attempt, Event.at).where(
            Event.rollout_id.in_(select(Rollout.id).where(Rollout.job_id == job_id)),
            Event.kind == EventKind.REQUEUED,
        )
    ).tuples():
        if rollout_id is not None:
            requeued.setdefault(rollout_id, []).append((attempt, at))
    terminal = Rollout.status.in_(list(RolloutStatus.TERMINAL))
    rollouts = {
        rollout_id: (attempt, finished_at if is_terminal else None)
        for rollout_id, attempt, finished_at, is_terminal in session.execute(
            select(Rollout.id, Rollout.attempt, Rollout.finished_at, terminal).where(
                Rollout.job_id == job_id
            )
        ).tuples()
    }
    return _AttemptEnds(requeued, rollouts)


def job_fingerprint(session: Session, job_id: uuid.UUID) -> tuple[object, ...]:
    """Changes whenever what the job page shows changes: a rollout's status, reason, attempt,
    reward or end; the job's own state (cancelled, stopped); a group found stale."""
    row = session.execute(
        select(
            func.count(),
            func.sum(Rollout.attempt),
            func.count(Rollout.reward),
            func.sum(Rollout.reward),
            func.count(Rollout.finished_at),
            func.max(Rollout.finished_at),
            *[func.count().filter(Rollout.status == s) for s in RolloutStatus.ALL],
        ).where(Rollout.job_id == job_id)
    ).one()
    job = session.execute(select(Job.status, Job.cancelled_at).where(Job.id == job_id)).one()
    stale = session.scalar(
        select(func.count()).select_from(StaleGroup).where(StaleGroup.job_id == job_id)
    )
    return (*row, *job, stale)


def rollout_fingerprint(session: Session, rollout_id: uuid.UUID) -> tuple[object, ...]:
    """Changes whenever the rollout moves, logs an event, or the proxy stores one of its calls."""
    row = session.execute(
        select(
            Rollout.status, Rollout.attempt, Rollout.reward, Rollout.created_at,
            Rollout.finished_at,
        ).where(Rollout.id == rollout_id)
    ).one_or_none()  # fmt: skip
    last_event = session.scalar(select(func.max(Event.id)).where(Event.rollout_id == rollout_id))
    window = calls_window(row.created_at, row.finished_at) if row else []
    calls = session.scalar(
        select(func.count()).select_from(LlmCall).where(LlmCall.rollout_id == rollout_id, *window)
    )
    return (tuple(row[:3]) if row else None, last_event, calls)


TASK_TEXT_CHARS = 160
"""Characters of a task's instruction shown in a job page's group table."""


def task_texts(session: Session, job_id: uuid.UUID, task_indexes: list[int]) -> dict[int, str]:
    """The start of each listed task's instruction (cut in SQL: an SWE task's instance can carry
    whole test files, which the group table does not need)."""
    if not task_indexes:
        return {}
    text = func.substr(JobTask.instance["instruction"].as_string(), 1, TASK_TEXT_CHARS + 1)
    rows = session.execute(
        select(JobTask.task_index, text).where(
            JobTask.job_id == job_id, JobTask.task_index.in_(task_indexes)
        )
    ).tuples()
    return {
        index: (value if len(value) <= TASK_TEXT_CHARS else value[:TASK_TEXT_CHARS] + "…")
        for index, value in rows
        if value is not None
    }
