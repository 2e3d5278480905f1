"""Over-provisioning and early stop: act on a job's `stop` rule when one of its rollouts ends, and
report what it did (`stop_status`, the `stop` part of a job's status).

A job may ask for more rollouts than it needs (`stop` in the job spec):

- `usable_samples_per_group: N`: a group is complete as soon as N of its rollouts ended usable
  (`lifecycle.completeness.group_query`, so results, leases and status agree without this
  module). With `stragglers: cancel` this module cancels the group's unfinished rollouts (running
  agents are killed at their next lease heartbeat, runtimes released); with `withhold` they run
  on, are listed with `straggler: true` and never count in the group.
- `groups: M`: once M groups of the job are complete, the job is *stopped*: every unfinished
  rollout of the other groups is cancelled and a job-level `stopped` event records the numbers.

`after_rollout_ended` is called by the workers (and the sweeper) in a transaction of its own right
after a rollout's terminal state is *committed*. That order is what makes it race-free on
PostgreSQL (READ COMMITTED) without locks: of two rollouts of a group that end at once, the one
whose commit lands last runs its check after both commits, so it sees both and no stop is missed.
Applying a stop twice is harmless: cancels are conditional UPDATEs (a rollout taken by one caller
is skipped by the other, which waits on its row lock and re-checks), and the job stop is a
compare-and-set `status active -> stopped` that exactly one caller wins. A check lost to a crash
only costs compute: completeness never depends on it, and the check is repeated when the next
rollout of that group (a straggler) ends or the next group completes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.orm import Session

from polar_mq.jobs.read_models import StopStatus
from polar_mq.lifecycle.cancel import R, cancel_where
from polar_mq.lifecycle.completeness import group_query
from polar_mq.models import Event, EventKind, Job
from polar_mq.models.base import utcnow
from polar_mq.spec import JobSpec, load_spec

ACTIVE = "active"
STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class StopApplied:
    """What one check did (for logs and tests); empty when there was nothing to do."""

    stragglers_cancelled: list[uuid.UUID] = field(default_factory=list)
    job_stopped: bool = False
    rollouts_cancelled: list[uuid.UUID] = field(default_factory=list)


def after_rollout_ended(
    session: Session, job_id: uuid.UUID, task_index: int, spec: JobSpec, worker: str
) -> StopApplied:
    """Apply the job's stop rule after a rollout of group `task_index` ended (and committed)."""
    rule = spec.stop
    if rule is None:
        return StopApplied()
    group = session.execute(group_query(job_id, True, task_index=task_index)).one_or_none()
    if group is None:  # this group is not complete, so no stop can have become due
        return StopApplied()
    stragglers: list[uuid.UUID] = []
    if rule.usable_samples_per_group is not None and rule.stragglers == "cancel":
        detail = {
            "early_stop": "group_complete",
            "usable_samples_per_group": rule.usable_samples_per_group,
        }
        scope = and_(R.job_id == job_id, R.task_index == task_index)
        stragglers = [c.id for c in cancel_where(session, scope, worker, detail)]
    if rule.groups is None:
        return StopApplied(stragglers_cancelled=stragglers)
    stopped, cancelled = _stop_job(session, job_id, rule.groups, worker)
    return StopApplied(stragglers, stopped, cancelled)


def _stop_job(
    session: Session, job_id: uuid.UUID, groups: int, worker: str
) -> tuple[bool, list[uuid.UUID]]:
    """Stop the job once `groups` of its groups are complete; (stopped now, rollouts cancelled)."""
    if session.scalar(select(Job.status).where(Job.id == job_id)) != ACTIVE:
        return False, []  # already stopped (or cancelled): nothing left to decide
    complete = group_query(job_id, complete_only=True).subquery()
    n_complete = int(session.scalar(select(func.count()).select_from(complete)) or 0)
    if n_complete < groups:
        return False, []
    won = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == ACTIVE)
        .values(status=STOPPED)
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    ).first()
    if won is None:  # a concurrent check stopped it first
        return False, []
    detail = {"early_stop": "job_stopped", "groups": groups}
    # Re-evaluated inside the UPDATE: a group that completed meanwhile keeps its rollouts.
    others = R.task_index.not_in(select(complete.c.task_index))
    cancelled = cancel_where(session, and_(R.job_id == job_id, others), worker, detail)
    session.execute(
        insert(Event).values(
            job_id=job_id,
            rollout_id=None,
            stage="stop",
            kind=EventKind.STOPPED,
            attempt=1,
            worker=worker,
            at=utcnow(),
            detail={
                "groups": groups,
                "groups_complete": n_complete,
                "groups_stopped": len({c.task_index for c in cancelled}),
                "rollouts_cancelled": len(cancelled),
            },
        )
    )
    return True, [c.id for c in cancelled]


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
