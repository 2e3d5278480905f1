"""Groups too old for the trainer: found, recorded, kept out of the stream, never mixed silently.

A group's age is that of its oldest agent token: the lowest policy version among the LLM calls of
its rollouts' current attempts (judge calls are not trained on and do not count). With the
job's `max_staleness` S, a group is stale at version v when `v - oldest > S`.

What happens to a stale group depends on the job's `on_stale`:
- `withhold` (default): only complete groups are judged; a stale one is recorded and never
  leased, but stays in the results (flagged) for off-policy use. Long agent runs are never cut.
- `drop`: unfinished groups are judged too; a group that already holds a too-old token can never
  become fresh, so its unfinished rollouts are cancelled at once (reason `stale`), which frees
  their slots and the job's capacity for fresh groups.

Groups a trainer holds under a live lease, or has acknowledged, are left alone: staleness is
judged when a group is handed out, and a trainer may train on what it was handed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, func, insert, not_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from polar_mq.calls import job_calls_window
from polar_mq.lifecycle.cancel import cancel_where
from polar_mq.lifecycle.completeness import group_query
from polar_mq.models import (
    Event,
    EventKind,
    GroupDelivery,
    Job,
    LlmCall,
    Rollout,
    StaleAction,
    StaleGroup,
    TerminationReason,
)
from polar_mq.models.base import utcnow
from polar_mq.spec import StalenessSpec, load_spec


def oldest_allowed(staleness: StalenessSpec, current_version: int) -> int:
    """The lowest policy version a group may hold and still be streamed at `current_version`."""
    return current_version - staleness.max_staleness


def too_old_calls(job_id: uuid.UUID, oldest: int, task_index: Any) -> Any:
    """Correlated EXISTS: the group whose index is the outer column `task_index` holds an agent
    token older than `oldest`. Used by the lease candidates so a group completing concurrently
    can never slip through unjudged."""
    inner = Rollout.__table__.alias("stale_r")
    return (
        select(LlmCall.id)
        .join(inner, and_(inner.c.id == LlmCall.rollout_id, inner.c.attempt == LlmCall.attempt))
        .where(
            inner.c.job_id == job_id,
            inner.c.task_index == task_index,
            LlmCall.purpose == "agent",
            LlmCall.policy_version < oldest,
            job_calls_window(job_id),
        )
        .exists()
    )


def _stale_candidates(
    session: Session,
    job_id: uuid.UUID,
    oldest: int,
    complete_only: bool,
    now: Any,
    only: Sequence[int] | None,
) -> list[tuple[int, int]]:
    """(task_index, oldest version) of the groups to judge (all, or `only`) that are stale now."""
    d, s = GroupDelivery, StaleGroup
    held_or_acked = (
        select(d.task_index)
        .where(
            d.job_id == job_id,
            d.task_index == Rollout.task_index,
            (d.acked_at.is_not(None)) | (d.lease_expires_at > now),
        )
        .exists()
    )
    recorded = select(s.task_index).where(s.job_id == job_id, s.task_index == Rollout.task_index)
    query = (
        select(Rollout.task_index, func.min(LlmCall.policy_version))
        .join(LlmCall, and_(LlmCall.rollout_id == Rollout.id, LlmCall.attempt == Rollout.attempt))
        .where(
            Rollout.job_id == job_id,
            LlmCall.purpose == "agent",
            job_calls_window(job_id),
            not_(held_or_acked),
            not_(recorded.exists()),
            *([Rollout.task_index.in_(only)] if only is not None else []),
        )
        .group_by(Rollout.task_index)
        .having(func.min(LlmCall.policy_version) < oldest)
    )
    stale = {int(i): int(v) for i, v in session.execute(query).tuples()}
    if complete_only and stale:  # complete as results and leases define it
        groups = group_query(job_id, complete_only=True).subquery()
        keep: set[int] = set(
            session.scalars(select(groups.c.task_index).where(groups.c.task_index.in_(stale)))
        )
        stale = {i: v for i, v in stale.items() if i in keep}
    return sorted(stale.items())


def judge_staleness(
    session: Session,
    job: Job,
    current_version: int,
    worker: str = "api",
    only: Sequence[int] | None = None,
) -> int:
    """Record (and with `drop`, cut short) the job's groups that are stale now; how many.

    `only` limits the judgement to those groups (a lease judges the few it could hand out, so
    its cost follows the groups waiting for a trainer, not the size of the job)."""
    if only is not None and not only:
        return 0
    staleness = load_spec(job.spec).staleness
    if staleness is None:
        return 0
    drop = staleness.on_stale == "drop"
    oldest = oldest_allowed(staleness, current_version)
    now = utcnow()
    found = _stale_candidates(session, job.id, oldest, not drop, now, only)
    if not found:
        return 0
    action = StaleAction.DROPPED if drop else StaleAction.WITHHELD
    dialect = session.get_bind().dialect.name
    insert_ = postgresql.insert if dialect == "postgresql" else sqlite.insert
    recorded = session.execute(
        insert_(StaleGroup)
        .values(
            [
                {
                    "job_id": job.id, "task_index": index, "action": action,
                    "min_version": version, "current_version": current_version, "at": now,
                }
                for index, version in found
            ]
        )
        .on_conflict_do_nothing()
        .returning(StaleGroup.task_index, StaleGroup.min_version)
    ).all()  # fmt: skip
    if not recorded:
        return 0
    indexes = [row.task_index for row in recorded]
    session.execute(
        insert(Event),
        [
            {
                "job_id": job.id, "rollout_id": None, "stage": "policy", "kind": EventKind.STALE,
                "attempt": 1, "worker": worker, "at": now,
                "detail": {
                    "task_index": row.task_index, "action": action,
                    "min_version": row.min_version, "current_version": current_version,
                    "max_staleness": staleness.max_staleness,
                },
            }
            for row in recorded
        ],
    )  # fmt: skip
    if drop:
        _cancel_unfinished(session, job.id, indexes, worker)
    return len(recorded)


def _cancel_unfinished(
    session: Session, job_id: uuid.UUID, indexes: list[int], worker: str
) -> None:
    """Cancel the unfinished rollouts of dropped groups with reason `stale`. Running stages see
    the change within seconds (their lease keeper's check) and stop (their fenced commits then
    find nothing)."""
    scope = and_(Rollout.job_id == job_id, Rollout.task_index.in_(indexes))
    detail = {"reason": TerminationReason.STALE}
    cancel_where(session, scope, worker, detail, reason=TerminationReason.STALE)


def stale_groups(session: Session, job_id: uuid.UUID, indexes: list[int]) -> dict[int, str]:
    """task_index → action (withheld | dropped) for the recorded stale groups among `indexes`."""
    if not indexes:
        return {}
    rows = session.execute(
        select(StaleGroup.task_index, StaleGroup.action).where(
            StaleGroup.job_id == job_id, StaleGroup.task_index.in_(indexes)
        )
    ).tuples()
    return {int(index): str(action) for index, action in rows}
