"""The `created_at` range a rollout's calls fall in, so reads by rollout skip other days.

`llm_calls` is partitioned by day: a query by `rollout_id` alone probes the index of every
partition (and plans each one: ~3 ms at 60 partitions). A rollout's calls are made after it was
created and before it finished; bounding `created_at` by those, with a day of slack for clocks
that differ between the API, the workers and the proxy (the proxy stamps `created_at`), lets
PostgreSQL prune the plan to two or three partitions. The bounds never exclude a real call unless
a clock is off by more than a day.

Reads across a whole job (staleness) bound by the job's creation instead: no call of the job's
rollouts is older than the job. Written as a scalar subquery, PostgreSQL evaluates it once before
the scan (an InitPlan) and prunes the partitions at run time.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Interval, literal, select

from polar_mq.models import Job, LlmCall

CLOCK_SLACK = timedelta(days=1)


def calls_window(created_at: datetime | None, finished_at: datetime | None) -> list[Any]:
    """Conditions on `LlmCall.created_at` for a rollout created/finished at these times."""
    bounds: list[ColumnElement[bool]] = []
    if created_at is not None:
        bounds.append(LlmCall.created_at >= window_start(created_at))
    if finished_at is not None:
        bounds.append(LlmCall.created_at <= finished_at + CLOCK_SLACK)
    return bounds


def window_start(created_at: datetime) -> datetime:
    """The earliest `created_at` a call of a rollout created at `created_at` may have."""
    return created_at - CLOCK_SLACK


def job_calls_window(job_id: uuid.UUID) -> ColumnElement[bool]:
    """The condition on `LlmCall.created_at` for calls of job `job_id`'s rollouts."""
    created = select(Job.created_at).where(Job.id == job_id).scalar_subquery()
    return LlmCall.created_at >= created - literal(CLOCK_SLACK, Interval())
