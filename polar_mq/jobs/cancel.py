"""Cancelling a job or a rollout on request (the API's service over `lifecycle.cancel`).

Cancelling only writes the database: every non-terminal rollout becomes `cancelled` (an
infrastructure outcome: no reward, excluded from group statistics). Queued messages then find a
terminal rollout and are no-ops; a running stage's lease keeper sees it within seconds (it checks
every 2 s, between renewals) and kills the agent's process tree and releases the runtime;
runtimes left on a node by a rollout cancelled between stages are removed by that node's janitor.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from polar_mq.infra.errors import NotFound
from polar_mq.lifecycle.cancel import ROLLOUTS, R, cancel_where
from polar_mq.models import Job, Rollout, RolloutStatus
from polar_mq.models.base import utcnow


@dataclass(frozen=True, slots=True)
class CancelResult:
    cancelled: list[uuid.UUID]
    """Rollouts this call moved to `cancelled`."""
    already_terminal: int
    """Rollouts that had already ended (completed, failed or cancelled) and were left alone."""


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
