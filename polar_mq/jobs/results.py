"""The results read service: a job's groups, page by page, as a trainer consumes them.

Complete groups are ordered by when they completed (the `finished_at` of their last rollout), so a
trainer polling with a cursor sees each group once, as it completes; every group carries its own
cursor so a poller can resume from any of them. Timestamps are taken before commit, so commits can
land out of timestamp order: while a job still runs, a group is only listed once its completion is
`RESULTS_SETTLE_S` old, which keeps a cursor from moving past a group whose commit was in flight.

A group is *complete* when every rollout is terminal, or, for a job with
`stop.usable_samples_per_group: N`, as soon as N of its rollouts ended usable (the one definition is
`completeness.group_query`). A rollout the sweeper sends back for another attempt is not terminal,
so its group is not complete until the retry ends. A complete group with fewer usable samples than
it should have (all of its rollouts, or N) is delivered with `incomplete: true`; its statistics and
advantages cover the usable samples only (see `group_stats`). Stragglers of an early-complete group
(rollouts not yet terminal when it completed) are listed with `straggler: true` and never count.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from polar_mq.jobs.cursors import decode_cursor, encode_cursor
from polar_mq.jobs.group_stats import (
    ADVANTAGE_KINDS,
    grpo_advantage,
    is_usable,
    public_reward,
    reward_stats,
)
from polar_mq.jobs.job_state import RolloutCounts, job_state
from polar_mq.jobs.queries import clamp_limit, get_job, job_counts
from polar_mq.jobs.read_models import (
    GroupResult,
    PolicyVersions,
    ResultsPage,
    SampleResult,
    TrajectoryTokens,
    record,
)
from polar_mq.lifecycle.completeness import group_query, is_straggler
from polar_mq.models import Job, JobTask, Rollout, TrajectorySample
from polar_mq.models.base import utcnow
from polar_mq.policy.staleness import stale_groups
from polar_mq.spec import load_spec

RESULTS_SETTLE_S = 1.0


def group_id(job_id: uuid.UUID, task_index: int) -> str:
    """The stable id of a group: the same for every page, poll and export of a job."""
    return f"{job_id}:{task_index}"


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
    advantages: str | None = None,
) -> ResultsPage:
    """One page of a job's groups with their samples, in completion order (or task order).

    `settle_s` (default RESULTS_SETTLE_S) holds back just-completed groups of a running job;
    `advantages="grpo"` adds each usable sample's group-relative advantage.
    """
    if advantages is not None and advantages not in ADVANTAGE_KINDS:
        raise ValueError(f"unknown advantages {advantages!r}; known: {', '.join(ADVANTAGE_KINDS)}")
    job = get_job(session, job_id)
    limit = clamp_limit(limit)
    counts = job_counts(session, [job_id]).get(job_id, RolloutCounts())
    finished = counts.total > 0 and counts.terminal == counts.total
    query = group_query(job_id, complete_only)
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
    groups = build_groups(
        session, job_id, page[:limit], complete_only, include_trajectories, advantages
    )
    return ResultsPage(
        job_id=job.id,
        job_state=job_state(job, counts),
        job_finished=finished,
        groups=groups,
        next_cursor=groups[-1].cursor if more and groups else None,
    )


def build_groups(
    session: Session,
    job_id: uuid.UUID,
    page: Sequence[Any],
    complete_only: bool,
    include_trajectories: bool,
    advantages: str | None,
) -> list[GroupResult]:
    """The serialised groups of `page` (rows of `group_query`), in the order of `page`."""
    indexes = [row.task_index for row in page]
    rollouts = _rollouts(session, job_id, indexes)
    pieces = _pieces(session, job_id, indexes, include_trajectories)
    rows = session.execute(
        select(JobTask.task_index, JobTask.instance).where(
            JobTask.job_id == job_id, JobTask.task_index.in_(indexes)
        )
    ).tuples()
    tasks: dict[int, dict[str, Any]] = {index: instance for index, instance in rows}
    stale = stale_groups(session, job_id, indexes)
    needed = _usable_needed(session, job_id)
    groups = []
    for row in page:
        complete = True if complete_only else bool(row.complete)
        members = rollouts.get(row.task_index, [])
        late = [is_straggler(complete, row.completed_at, r.status, r.finished_at) for r in members]
        usable = [
            not straggler and is_usable(r.status, r.termination_reason, r.reward)
            for r, straggler in zip(members, late, strict=True)
        ]
        stats = reward_stats([r.reward for r, ok in zip(members, usable, strict=True) if ok])
        gid = group_id(job_id, row.task_index)
        samples = []
        for r, ok, straggler in zip(members, usable, late, strict=True):
            advantage = None
            if advantages == "grpo" and complete and ok:
                advantage = grpo_advantage(r.reward, stats)
            own = pieces.get(r.id, [])
            samples.append(
                SampleResult(
                    group_id=gid,
                    rollout_id=r.id,
                    sample_index=r.sample_index,
                    status=r.status,
                    termination_reason=r.termination_reason,
                    usable=ok,
                    reward=public_reward(r.termination_reason, r.reward),
                    advantage=advantage,
                    attempt=r.attempt,
                    n_llm_calls=r.n_llm_calls,
                    policy_versions=_policy_versions(p.meta for p in own),
                    trajectories=own if include_trajectories and not straggler else None,
                    straggler=straggler,
                )
            )
        groups.append(
            GroupResult(
                group_id=gid,
                task_index=row.task_index,
                task=tasks.get(row.task_index, {}),
                complete=complete,
                incomplete=complete and stats.n_usable < (needed or len(members)),
                completed_at=row.completed_at if complete else None,
                cursor=_group_cursor(complete_only, row.task_index, row.completed_at),
                n_samples=len(members),
                n_usable=stats.n_usable,
                mean_reward=stats.mean,
                std_reward=stats.std,
                samples=samples,
                policy_versions=_group_versions(samples),
                stale=stale.get(row.task_index),
            )
        )
    return groups


def _group_versions(samples: list[SampleResult]) -> PolicyVersions | None:
    seen = sorted({v for s in samples if s.policy_versions for v in s.policy_versions.versions})
    return PolicyVersions(min=seen[0], max=seen[-1], versions=seen) if seen else None


def _usable_needed(session: Session, job_id: uuid.UUID) -> int | None:
    """`stop.usable_samples_per_group` of the job (already in the session's identity map)."""
    job = session.get(Job, job_id)
    stop = load_spec(job.spec).stop if job is not None else None
    return stop.usable_samples_per_group if stop is not None else None


def _rollouts(session: Session, job_id: uuid.UUID, indexes: list[int]) -> dict[int, list[Any]]:
    if not indexes:
        return {}
    out: dict[int, list[Any]] = {}
    columns = (
        Rollout.id, Rollout.task_index, Rollout.sample_index, Rollout.status,
        Rollout.termination_reason, Rollout.reward, Rollout.attempt, Rollout.n_llm_calls,
        Rollout.finished_at,
    )  # fmt: skip
    for r in session.execute(
        select(*columns)
        .where(Rollout.job_id == job_id, Rollout.task_index.in_(indexes))
        .order_by(Rollout.task_index, Rollout.sample_index)
    ):
        out.setdefault(r.task_index, []).append(r)
    return out


class _MetaOnly:
    """A training sample of which only the metadata was read (trajectories not asked for)."""

    __slots__ = ("meta",)

    def __init__(self, meta: Any) -> None:
        self.meta = meta if isinstance(meta, dict) else {}


def _pieces(
    session: Session, job_id: uuid.UUID, indexes: list[int], include_trajectories: bool
) -> dict[uuid.UUID, list[Any]]:
    """The training samples of the current attempt of each rollout, in order: the token arrays
    when asked for, else only their metadata (for the policy versions)."""
    if not indexes:
        return {}
    current_attempt = and_(
        Rollout.id == TrajectorySample.rollout_id, Rollout.attempt == TrajectorySample.attempt
    )
    if include_trajectories:
        columns = [getattr(TrajectorySample, f.name) for f in fields(TrajectoryTokens)]
    else:
        columns = [TrajectorySample.meta]
    out: dict[uuid.UUID, list[Any]] = {}
    for row in session.execute(
        select(TrajectorySample.rollout_id, *columns)
        .join(Rollout, current_attempt)
        .where(Rollout.job_id == job_id, Rollout.task_index.in_(indexes))
        .order_by(TrajectorySample.rollout_id, TrajectorySample.sample_index)
    ):
        piece = record(TrajectoryTokens, row) if include_trajectories else _MetaOnly(row.meta)
        out.setdefault(row.rollout_id, []).append(piece)
    return out


def _policy_versions(metas: Any) -> PolicyVersions | None:
    """Min, max and distinct policy versions named by the samples' `policy_versions` meta."""
    seen: set[int] = set()
    for meta in metas:
        versions = meta.get("policy_versions") if isinstance(meta, dict) else None
        if isinstance(versions, list):
            seen.update(v for v in versions if isinstance(v, int) and not isinstance(v, bool))
    if not seen:
        return None
    ordered = sorted(seen)
    return PolicyVersions(min=ordered[0], max=ordered[-1], versions=ordered)
