"""Reward and learning-signal metrics on the API's `/metrics`, counted in PostgreSQL.

- `polar_rollout_reward` (histogram): the rewards of every usable rollout (terminal, ended by
  the agent, scored), labelled by the agent's termination reason only (completed, agent_error,
  timeout, max_turns, token_budget): never by job, so the series stay few however many jobs run.
  `rate(polar_rollout_reward_sum[5m]) / rate(polar_rollout_reward_count[5m])` is the recent mean.
- `polar_groups_ended_total{signal}`: groups whose every sample ended, by learning signal: `some`
  (usable rewards differ), `none` (two or more usable samples, all the same reward: zero variance,
  no GRPO gradient), `too_few` (fewer than two usable samples).

Both are read from the database when Prometheus scrapes, as `polar_rollouts` is (so every API
replica reports the same numbers, and they survive restarts), at most once per `cache_s`: one
aggregate over the rollouts for the histogram, one GROUP BY job and task for the groups. They
only grow, except when retention deletes old jobs (Prometheus reads that as a counter reset).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.completeness import group_reward_spread, usable_condition
from polar_mq.models import Rollout, TerminationReason

log = logging.getLogger(__name__)

REWARD_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 2.0, 5.0, 10.0)
"""Upper bounds. No negative one: Prometheus histograms drop `_sum`/`_count` with negative
buckets, so a negative reward counts in `le="0"` (its true value still goes to `_sum`)."""
SIGNALS = ("some", "none", "too_few")
FactorySource = Callable[[], "sessionmaker[Session] | None"]


@dataclass(frozen=True, slots=True)
class RewardHistogram:
    """Per termination reason: cumulative counts per bucket bound (+Inf last) and the sum."""

    buckets: dict[str, list[int]]
    sums: dict[str, float]


@dataclass(frozen=True, slots=True)
class RewardCounts:
    rewards: RewardHistogram
    groups: dict[str, int]


def reward_histogram(session: Session) -> RewardHistogram:
    """One aggregate over the usable rollouts: the count at or under each bound, per reason."""
    columns = [func.count(case((Rollout.reward <= bound, 1))) for bound in REWARD_BUCKETS]
    rows = session.execute(
        select(Rollout.termination_reason, func.count(), func.sum(Rollout.reward), *columns)
        .where(usable_condition())
        .group_by(Rollout.termination_reason)
    ).tuples()
    buckets: dict[str, list[int]] = {}
    sums: dict[str, float] = {}
    for reason, n, total, *under in rows:
        label = reason or "unknown"
        buckets[label] = [int(c) for c in under] + [int(n)]
        sums[label] = float(total or 0.0)
    return RewardHistogram(buckets, sums)


def group_signals(session: Session) -> dict[str, int]:
    """Ended groups of every job by learning signal (see the module docstring)."""
    per_group = group_reward_spread()
    g = per_group.c
    ended = g.n_terminal == g.n
    row = session.execute(
        select(
            func.count(case((and_(ended, g.n_usable >= 2, g.low != g.high), 1))),
            func.count(case((and_(ended, g.n_usable >= 2, g.low == g.high), 1))),
            func.count(case((and_(ended, g.n_usable < 2), 1))),
        )
    ).one()
    return dict(zip(SIGNALS, (int(row[0]), int(row[1]), int(row[2])), strict=True))


class RewardCollector(Collector):
    """`polar_rollout_reward` and `polar_groups_ended_total`, read at most once per period."""

    def __init__(self, factory: FactorySource, cache_s: float) -> None:
        self._factory = factory
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._counts: RewardCounts | None = None

    def counts(self) -> RewardCounts | None:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self._cache_s:
                self._counts = self._read()
                self._read_at = now
            return self._counts

    def _read(self) -> RewardCounts | None:
        factory = self._factory()
        if factory is None:
            return None
        try:
            with factory() as session:
                return RewardCounts(reward_histogram(session), group_signals(session))
        except Exception as exc:  # the state collector reports the database as down
            log.warning("metrics: cannot count rewards and groups: %s", exc)
            return None

    def collect(self) -> Iterator[Metric]:
        counts = self.counts()
        if counts is None:
            return
        histogram = HistogramMetricFamily(
            "polar_rollout_reward",
            "Rewards of usable rollouts, by the agent's termination reason",
            labels=["reason"],
        )
        bounds = [*(f"{b:g}" for b in REWARD_BUCKETS), "+Inf"]
        empty = [0] * len(bounds)
        reasons = sorted(set(TerminationReason.AGENT) | set(counts.rewards.buckets))
        for reason in reasons:  # every agent outcome from the start: no series appears late
            cumulative = counts.rewards.buckets.get(reason, empty)
            total = counts.rewards.sums.get(reason, 0.0)
            histogram.add_metric([reason], list(zip(bounds, cumulative, strict=True)), total)
        yield histogram
        groups = CounterMetricFamily(
            "polar_groups_ended",
            "Groups whose samples all ended, by learning signal (none: zero reward variance)",
            labels=["signal"],
        )
        for signal in SIGNALS:
            groups.add_metric([signal], counts.groups[signal])
        yield groups
