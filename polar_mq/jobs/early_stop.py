"""The early-stop part of a job's status: its `stop` rule and what the stop did.

The stop itself is applied by `polar_mq.lifecycle.early_stop` when rollouts end.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.jobs.read_models import StopStatus
from polar_mq.lifecycle.early_stop import STOPPED
from polar_mq.models import Event, EventKind, Job
from polar_mq.spec import load_spec


def stop_status(session: Session, job: Job) -> StopStatus | None:
    """The job's stop rule and, once the job stopped, what the stop did (for the status API)."""
    rule = load_spec(job.spec).stop
    if rule is None:
        return None
    at, detail = None, {}
    if job.status == STOPPED:
        row = session.execute(
            select(Event.at, Event.detail)
            .where(
                Event.rollout_id.is_(None),  # served by ix_events_rollout
                Event.job_id == job.id,
                Event.kind == EventKind.STOPPED,
            )
            .order_by(Event.id)
            .limit(1)
        ).first()
        if row is not None:
            at, detail = row.at, dict(row.detail or {})
    return StopStatus(
        usable_samples_per_group=rule.usable_samples_per_group,
        groups=rule.groups,
        stragglers=rule.stragglers,
        stopped=job.status == STOPPED,
        stopped_at=at,
        groups_complete_at_stop=detail.get("groups_complete"),
        groups_stopped=detail.get("groups_stopped"),
        rollouts_cancelled=detail.get("rollouts_cancelled"),
    )
