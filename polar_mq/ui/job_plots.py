"""The numbers behind a job page's plots: rewards, no-signal groups, tokens, latency, policy
versions and throughput, each aggregated in the database.

A job can hold 10k rollouts and 100k LLM calls, so nothing here loads a row per call: the calls
are scanned four times in all (their tokens and latency share two scans, `sql_stats.distributions`;
one GROUP BY rollout gives the per-rollout tokens and first policy version, one row per rollout;
one GROUP BY time bin gives the tokens over time), the rollouts a few times more. The rollouts are
read through their job index; the calls through their rollout, bounded below by the job's
creation so PostgreSQL prunes the day partitions older than the job
(`calls.window.job_calls_window`). Only the agent's calls count (a judge's are not the policy's
tokens).

A rollout's policy version is the version of its first call (the weights most of its tokens came
from in the common case of one version per rollout). Token counts are the captured id arrays'
lengths (4 bytes per packed id), never a re-tokenisation.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, literal, select
from sqlalchemy.orm import Session

from polar_mq.calls.window import job_calls_window
from polar_mq.lifecycle.completeness import group_reward_spread, usable_condition
from polar_mq.models import Job, LlmCall, Rollout
from polar_mq.models.base import UtcDateTime
from polar_mq.ui.sql_stats import (
    Distribution,
    distribution_of,
    distributions,
    floor_of,
    seconds_between,
)

TIME_BINS = 40
"""Bins of the throughput-over-time chart."""


@dataclass(frozen=True, slots=True)
class GroupSignal:
    """Ended groups of a job by learning signal: a group whose usable rewards are all equal
    (zero variance) gives GRPO no gradient."""

    ended: int
    """Groups whose every sample is terminal."""
    no_signal: int
    """Ended groups with at least two usable samples, all with the same reward."""
    too_few: int
    """Ended groups with fewer than two usable samples (no variance to speak of)."""

    @property
    def no_signal_fraction(self) -> float | None:
        scored = self.ended - self.too_few
        return self.no_signal / scored if scored > 0 else None


@dataclass(frozen=True, slots=True)
class VersionReward:
    """The usable rollouts whose first call was served by one policy version."""

    version: int
    n: int
    mean: float
    low: float
    high: float


@dataclass(frozen=True, slots=True)
class Throughput:
    """Finished rollouts and completion tokens per time bin since the job was created."""

    bin_s: float
    rollouts: list[int]
    tokens: list[int]


@dataclass(frozen=True, slots=True)
class JobPlots:
    rewards: Distribution
    signal: GroupSignal
    call_tokens: Distribution
    call_latency_ms: Distribution
    rollout_tokens: Distribution
    rollout_seconds: Distribution
    versions: list[VersionReward]
    throughput: Throughput | None


def _job_rollouts(job_id: uuid.UUID) -> Any:
    return select(Rollout.id).where(Rollout.job_id == job_id)


def agent_calls(job_id: uuid.UUID) -> list[Any]:
    """Conditions selecting the agent calls of a job's rollouts."""
    return [
        LlmCall.rollout_id.in_(_job_rollouts(job_id)),
        job_calls_window(job_id),
        LlmCall.purpose == "agent",
    ]


def tokens_of(column: Any) -> Any:
    """Ids in a packed int32 column (NULL stays NULL)."""
    return func.length(column) / 4


def group_signal(session: Session, job_id: uuid.UUID) -> GroupSignal:
    per_group = group_reward_spread(Rollout.job_id == job_id)
    ended = per_group.c.n_terminal == per_group.c.n
    row = session.execute(
        select(
            func.count(case((ended, 1))),
            func.count(
                case(
                    (and_(ended, per_group.c.n_usable >= 2, per_group.c.low == per_group.c.high), 1)
                )
            ),
            func.count(case((and_(ended, per_group.c.n_usable < 2), 1))),
        )
    ).one()
    return GroupSignal(int(row[0]), int(row[1]), int(row[2]))


@dataclass(frozen=True, slots=True)
class PerRollout:
    """What the job's calls say per rollout: completion tokens, and the usable rewards by the
    policy version of each rollout's first call."""

    tokens: Distribution
    versions: list[VersionReward]


def per_rollout(session: Session, job_id: uuid.UUID) -> PerRollout:
    """One scan of the job's calls grouped by rollout (one row per rollout with calls comes
    back: bounded by the job's rollouts, never by its calls)."""
    per = (
        select(
            LlmCall.rollout_id.label("rollout_id"),
            func.sum(tokens_of(LlmCall.completion_ids)).label("tokens"),
            func.min(LlmCall.policy_version).label("version"),
        )
        .where(*agent_calls(job_id))
        .group_by(LlmCall.rollout_id)
        .subquery()
    )
    rows = session.execute(
        select(per.c.tokens, per.c.version, case((usable_condition(), Rollout.reward))).join(
            Rollout, Rollout.id == per.c.rollout_id
        )
    ).tuples()
    tokens: list[float] = []
    by_version: dict[int, list[float]] = {}
    for n_tokens, version, reward in rows:
        if n_tokens is not None:
            tokens.append(float(n_tokens))
        if reward is not None:
            by_version.setdefault(int(version), []).append(float(reward))
    versions = [
        VersionReward(v, len(r), math.fsum(r) / len(r), min(r), max(r))
        for v, r in sorted(by_version.items())
    ]
    return PerRollout(distribution_of(tokens), versions)


def throughput(session: Session, job_id: uuid.UUID, bins: int = TIME_BINS) -> Throughput | None:
    created, last = session.execute(
        select(Job.created_at, func.max(Rollout.finished_at))
        .join(Rollout, Rollout.job_id == Job.id)
        .where(Job.id == job_id)
        .group_by(Job.created_at)
    ).one_or_none() or (None, None)
    if created is None or last is None:
        return None
    span = max((last - created).total_seconds(), 1e-3)
    bin_s = span / bins

    def binned(at: Any, weight: Any, *where: Any) -> list[int]:
        offset = seconds_between(session, literal(created, UtcDateTime()), at)
        index = case((offset >= span, bins - 1), else_=floor_of(session, offset / bin_s))
        out = [0] * bins
        query = select(index, func.sum(weight)).where(*where).group_by(index)
        for i, total in session.execute(query).tuples():
            out[min(bins - 1, max(0, int(i)))] += int(total or 0)
        return out

    rollouts = binned(
        Rollout.finished_at, 1, Rollout.job_id == job_id, Rollout.finished_at.is_not(None)
    )
    tokens = binned(
        LlmCall.created_at,
        func.coalesce(tokens_of(LlmCall.completion_ids), 0),
        *agent_calls(job_id),
    )
    return Throughput(bin_s, rollouts, tokens)


def job_plots(session: Session, job_id: uuid.UUID) -> JobPlots:
    took = seconds_between(session, Rollout.started_at, Rollout.finished_at)
    rollouts = distributions(
        session,
        {"reward": case((usable_condition(), Rollout.reward)), "seconds": took},
        [Rollout.job_id == job_id],
    )
    calls = distributions(
        session,
        {"tokens": tokens_of(LlmCall.completion_ids), "latency": LlmCall.latency_ms},
        agent_calls(job_id),
    )
    rollout_calls = per_rollout(session, job_id)
    return JobPlots(
        rewards=rollouts["reward"],
        signal=group_signal(session, job_id),
        call_tokens=calls["tokens"],
        call_latency_ms=calls["latency"],
        rollout_tokens=rollout_calls.tokens,
        rollout_seconds=rollouts["seconds"],
        versions=rollout_calls.versions,
        throughput=throughput(session, job_id),
    )
