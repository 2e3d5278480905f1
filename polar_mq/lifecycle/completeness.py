"""When is a group complete: the one definition the results pages, the streaming leases, the job
status and the early-stop service all read.

A group (all samples of one task) is *complete* when either

- every one of its rollouts is terminal, or
- the job asks for over-provisioning (`stop.usable_samples_per_group: N`) and N of its rollouts
  ended *usable* (terminal, an agent outcome, a reward; see `group_stats.is_usable`).

`completed_at` is when that became true: the `finished_at` of the N-th usable rollout (ties broken
by sample index) for an early-complete group, else the last `finished_at` of the group. It never
moves once the group is complete, so a cursor or a delivery made at that point stays valid when
the stragglers end later: a rollout that was not terminal at `completed_at` is a *straggler* and
never counts in the group (see `is_straggler`).

N is read from the job's stored spec inside the query itself, so callers (including the leases of
`deliveries.py`) need nothing but the job id, and a job without `stop` skips the ranking entirely
(a false one-time filter).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Select, Subquery, and_, case, func, literal, or_, select
from sqlalchemy.sql.elements import ColumnElement

from polar_mq.models import Job, Rollout, RolloutStatus, TerminationReason

_TERMINAL = tuple(RolloutStatus.TERMINAL)
_INFRASTRUCTURE = tuple(TerminationReason.INFRASTRUCTURE)


def terminal_flag() -> Any:
    """1 for a terminal rollout, else 0 (summed per group or per job)."""
    return case((Rollout.status.in_(_TERMINAL), 1), else_=0)


def usable_condition() -> ColumnElement[bool]:
    """SQL twin of `group_stats.is_usable` (terminal, not an infrastructure failure, scored).

    Rewards are finite by construction (evaluators turn NaN/inf into no reward).
    """
    return and_(
        Rollout.status.in_(_TERMINAL),
        or_(
            Rollout.termination_reason.is_(None),
            Rollout.termination_reason.not_in(_INFRASTRUCTURE),
        ),
        Rollout.reward.is_not(None),
    )


def group_reward_spread(*where: ColumnElement[bool]) -> Subquery:
    """Per group (job, task) of the rollouts `where` selects: `n` rollouts, `n_terminal` ended,
    `n_usable` usable, and the `low` and `high` usable reward (equal: no learning signal).
    The dashboard's job page and the reward metrics count no-signal groups from it."""
    usable = usable_condition()
    return (
        select(
            func.count().label("n"),
            func.sum(terminal_flag()).label("n_terminal"),
            func.count(case((usable, 1))).label("n_usable"),
            func.min(case((usable, Rollout.reward))).label("low"),
            func.max(case((usable, Rollout.reward))).label("high"),
        )
        .where(*where)
        .group_by(Rollout.job_id, Rollout.task_index)
        .subquery()
    )


def usable_needed(job_id: uuid.UUID) -> Any:
    """The job's `stop.usable_samples_per_group` as a scalar subquery (NULL when not set)."""
    path = Job.spec[("stop", "usable_samples_per_group")].as_integer()
    return select(path).where(Job.id == job_id).scalar_subquery()


def group_query(
    job_id: uuid.UUID, complete_only: bool, task_index: int | None = None
) -> Select[Any]:
    """(task_index, n, n_terminal, completed_at, complete) per group of a job.

    `task_index` narrows it to one group (the early-stop check runs it per finished rollout).
    """
    scope = [Rollout.job_id == job_id]
    if task_index is not None:
        scope.append(Rollout.task_index == task_index)
    needed = usable_needed(job_id)
    ranked = (
        select(
            Rollout.task_index.label("task_index"),
            Rollout.finished_at.label("finished_at"),
            func.row_number()
            .over(
                partition_by=Rollout.task_index,
                order_by=(Rollout.finished_at, Rollout.sample_index),
            )
            .label("rank"),
        )
        .where(*scope, usable_condition(), needed.is_not(None))
        .subquery()
    )
    nth = select(ranked.c.task_index, ranked.c.finished_at).where(ranked.c.rank == needed)
    nth_sub = nth.subquery()
    groups = (
        select(
            Rollout.task_index.label("task_index"),
            func.count().label("n"),
            func.sum(terminal_flag()).label("n_terminal"),
            func.max(func.coalesce(Rollout.finished_at, Rollout.created_at)).label("last_at"),
        )
        .where(*scope)
        .group_by(Rollout.task_index)
        .subquery()
    )
    complete = or_(groups.c.n_terminal == groups.c.n, nth_sub.c.finished_at.is_not(None))
    query = select(
        groups.c.task_index,
        groups.c.n,
        groups.c.n_terminal,
        func.coalesce(nth_sub.c.finished_at, groups.c.last_at).label("completed_at"),
        case((complete, literal(True)), else_=literal(False)).label("complete"),
    ).outerjoin(nth_sub, nth_sub.c.task_index == groups.c.task_index)
    if complete_only:
        query = query.where(complete)
    sub = query.subquery()
    return select(sub.c.task_index, sub.c.n, sub.c.n_terminal, sub.c.completed_at, sub.c.complete)


def is_straggler(
    complete: bool, completed_at: datetime | None, status: str, finished_at: datetime | None
) -> bool:
    """A member of a complete group that was still running when the group completed.

    Only an early-complete group (`usable_samples_per_group`) can have one: it is listed with its
    group but never counts in it (no statistics, no advantage, not usable), whatever it ends with,
    so every read and every redelivery of the group shows the same trainable samples.
    """
    if not complete or completed_at is None:
        return False
    if finished_at is None:
        return status not in RolloutStatus.TERMINAL
    return finished_at > completed_at
