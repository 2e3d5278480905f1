"""Cancelling rollouts: one compare-and-set UPDATE, the workers notice by themselves.

`cancel_where` is the one write every cancel goes through: the API's and the dashboard's `cancel`
(a job or one rollout, on request), an early stop's stragglers and stopped groups
(`jobs.early_stop`), and groups the trainer's policy moved past (`policy.staleness`).

Cancelling only writes the database: every non-terminal rollout becomes `cancelled` (an
infrastructure outcome: no reward, excluded from group statistics). Queued messages then find a
terminal rollout and are no-ops; a running stage's lease keeper sees it within seconds (it checks
every 2 s, between renewals) and kills the agent's process tree and releases the runtime;
runtimes left on a node by a rollout cancelled between stages are removed by that node's janitor.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.orm import Session

from polar_mq.infra.errors import NotFound
from polar_mq.models import Event, EventKind, Job, Rollout, RolloutStatus, TerminationReason
from polar_mq.models.base import utcnow

ROLLOUTS = cast(Table, Rollout.__table__)
R = ROLLOUTS.c


@dataclass(frozen=True, slots=True)
class Cancelled:
    id: uuid.UUID
    task_index: int


@dataclass(frozen=True, slots=True)
class CancelResult:
    cancelled: list[uuid.UUID]
    """Rollouts this call moved to `cancelled`."""
    already_terminal: int
    """Rollouts that had already ended (completed, failed or cancelled) and were left alone."""


def cancel_where(
    session: Session,
    scope: Any,
    worker: str,
    detail: dict[str, Any] | None = None,
    reason: str = TerminationReason.CANCELLED,
) -> list[Cancelled]:
    """Cancel the non-terminal rollouts matching `scope` (a SQL condition); the ones it took.

    One conditional UPDATE: a rollout that ended meanwhile (or that a concurrent cancel took) is
    left alone, so concurrent callers never cancel a rollout twice nor write two events for it.
    `detail` goes into each `cancelled` event (e.g. why an early stop cancelled it); `reason` is
    the termination reason (`stale` when the trainer's policy moved past the rollout).
    """
    now = utcnow()
    rows = session.execute(
        update(ROLLOUTS)
        .where(scope, R.status.not_in(list(RolloutStatus.TERMINAL)))
        .values(
            status=RolloutStatus.CANCELLED,
            termination_reason=reason,
            reward=None,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        )
        .returning(R.id, R.job_id, R.attempt, R.task_index)
    ).all()
    if rows:
        events: list[dict[str, Any]] = [
            {
                "job_id": row.job_id,
                "rollout_id": row.id,
                "stage": "cancel",
                "kind": EventKind.CANCELLED,
                "attempt": row.attempt,
                "worker": worker,
                "at": now,
                "detail": detail or {},
            }
            for row in rows
        ]
        session.execute(insert(Event), events)
    return [Cancelled(row.id, row.task_index) for row in rows]


def cancel(
    session: Session, *, job_id: uuid.UUID | None = None, rollout_id: uuid.UUID | None = None
) -> CancelResult:
    """Cancel every unfinished rollout of a job, or one rollout. Raises NotFound.

    Cancelling a job that still had unfinished rollouts stamps its `cancelled_at` (its state
    becomes `cancelled`); repeating the call keeps the first stamp."""
    if (job_id is None) == (rollout_id is None):
        raise ValueError("cancel needs exactly one of job_id and rollout_id")
    job: Job | None = None
    if job_id is not None:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound("job", job_id)
        scope = R.job_id == job_id
    else:
        if session.get(Rollout, rollout_id) is None:
            raise NotFound("rollout", rollout_id)
        scope = R.id == rollout_id
    cancelled = [c.id for c in cancel_where(session, scope, worker="api")]
    if job is not None and cancelled and job.cancelled_at is None:
        # Only a job this call stopped is `cancelled`: cancelling one that had already ended
        # leaves its state (completed, failed...) as it was.
        job.cancelled_at = utcnow()
    terminal = session.scalar(
        select(func.count())
        .select_from(ROLLOUTS)
        .where(scope, R.status.in_(list(RolloutStatus.TERMINAL)))
    )
    return CancelResult(cancelled, int(terminal or 0) - len(cancelled))
