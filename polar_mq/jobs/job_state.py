"""A job's state, from its own row and the outcome counts of its rollouts: the one definition the
status, the list, the results pages, the client, the CLI and the dashboard all show.

- `running`: some rollout is not terminal yet.
- `cancelled`: the job was cancelled (`cancelled_at`), or every rollout ended cancelled.
- `stopped`: the job reached `stop.groups` complete groups and stopped (see `jobs.early_stop`).
- `completed`: every rollout ended, none `failed` (some may have been cancelled on purpose: a
  rollout cancelled alone, a straggler an early stop cut, a group dropped as stale).
- `completed_with_failures`: every rollout ended, some `completed` and some `failed` (an
  infrastructure failure: no reward, see `TerminationReason.INFRASTRUCTURE`).
- `failed`: every rollout ended, some `failed` and none `completed`.

A job that ended is never `running` and never called `completed` when rollouts failed: before,
a job with 31 failures, or one fully cancelled, read as a green `completed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple, get_args

from sqlalchemy import ColumnElement, and_, case, func, or_, select

from polar_mq.jobs import early_stop
from polar_mq.jobs.read_models import JobStateName
from polar_mq.lifecycle.completeness import terminal_flag
from polar_mq.models import Job, Rollout, RolloutStatus

RUNNING: Final = "running"
COMPLETED: Final = "completed"
COMPLETED_WITH_FAILURES: Final = "completed_with_failures"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
STOPPED: Final = "stopped"
"""`jobs.early_stop.STOPPED`, the job row's status once it stopped."""
JOB_STATES: tuple[JobStateName, ...] = get_args(JobStateName)
ENDED_STATES = frozenset(JOB_STATES) - {RUNNING}


class RolloutCounts(NamedTuple):
    """A job's rollouts: all, terminal, ended `completed`, ended `failed`."""

    total: int = 0
    terminal: int = 0
    completed: int = 0
    failed: int = 0

    @classmethod
    def of(cls, row: Sequence[Any]) -> RolloutCounts:
        """From the values of `outcome_columns` (SUMs are NULL over no rows)."""
        return cls(*(int(value or 0) for value in row))


def outcome_columns() -> tuple[Any, ...]:
    """The SQL aggregates behind `RolloutCounts`, in its field order."""
    return (
        func.count(),
        func.sum(terminal_flag()),
        func.count().filter(Rollout.status == RolloutStatus.COMPLETED),
        func.count().filter(Rollout.status == RolloutStatus.FAILED),
    )


def job_state(job: Job, counts: RolloutCounts) -> JobStateName:
    """The job's state (see the module docstring)."""
    if job.cancelled_at is not None or job.status == CANCELLED:
        return CANCELLED
    if job.status == early_stop.STOPPED:
        return STOPPED
    if not counts.total or counts.terminal < counts.total:
        return RUNNING
    if not counts.failed:
        return COMPLETED if counts.completed else CANCELLED
    return COMPLETED_WITH_FAILURES if counts.completed else FAILED


def job_states_by_count() -> Any:
    """`SELECT state, count(*)` over every job, the state computed in SQL by `job_state`'s rule
    (its twin; `tests/jobs/test_job_state_sql.py` holds them to the same answers): one pass over
    the rollouts grouped by job, for a metrics scrape that must not load every job."""
    total, terminal, completed, failed = (c.label(n) for c, n in zip(
        outcome_columns(), RolloutCounts._fields, strict=True
    ))  # fmt: skip
    counts = select(Rollout.job_id, total, terminal, completed, failed).group_by(Rollout.job_id)
    per_job = counts.subquery()
    state = _state_case(per_job.c.total, per_job.c.terminal, per_job.c.completed, per_job.c.failed)
    return (
        select(state, func.count())
        .select_from(Job)
        .outerjoin(per_job, per_job.c.job_id == Job.id)
        .group_by(state)
    )


def _state_case(total: Any, terminal: Any, completed: Any, failed: Any) -> ColumnElement[str]:
    some_failed = func.coalesce(failed, 0) > 0
    some_completed = func.coalesce(completed, 0) > 0
    return case(
        (or_(Job.cancelled_at.is_not(None), Job.status == CANCELLED), CANCELLED),
        (Job.status == early_stop.STOPPED, STOPPED),
        (or_(func.coalesce(total, 0) == 0, terminal < total), RUNNING),
        (and_(~some_failed, some_completed), COMPLETED),
        (~some_failed, CANCELLED),
        (some_completed, COMPLETED_WITH_FAILURES),
        else_=FAILED,
    )
