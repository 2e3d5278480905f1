"""Distributions computed in the database: a count, the range, the mean and binned counts.

A job of 10k rollouts has ~100k LLM calls; the dashboard must not load them to draw a histogram.
`distributions` reads the rows twice for any number of quantities of them: their counts, ranges
and sums, then the count per bin, grouped in SQL (a scan of a job's calls is what costs, not the
arithmetic, so the quantities share the scans). Only the bins come back.

The few expressions that differ between PostgreSQL and the embedded SQLite (flooring, seconds
between two timestamps) are chosen by the session's dialect here, so the plots work on both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, Integer, case, cast, func, select
from sqlalchemy.orm import Session

from polar_mq.ui.charts import Histogram

BINS = 20


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def floor_of(session: Session, value: Any) -> Any:
    """floor(value) for a non-negative value (SQLite's CAST truncates; PostgreSQL's rounds)."""
    return func.floor(value) if is_postgres(session) else cast(value, Integer)


def seconds_between(session: Session, start: Any, end: Any) -> Any:
    """`end - start` in seconds, as a float expression."""
    if is_postgres(session):
        return func.extract("epoch", end - start)
    return (func.julianday(end) - func.julianday(start)) * 86400.0


@dataclass(frozen=True, slots=True)
class Distribution:
    """Values binned over [low, high] (`hist`), with their count, mean and maximum."""

    n: int
    mean: float | None
    low: float | None
    high: float | None
    hist: Histogram | None

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bin where the q-th quantile falls (the bins' resolution)."""
        if self.hist is None or not self.n:
            return None
        if self.low == self.high:
            return self.low
        seen, rank = 0, q * self.n
        for i, count in enumerate(self.hist.counts):
            seen += count
            if seen >= rank:
                return self.hist.edges[i + 1]
        return self.high


EMPTY = Distribution(0, None, None, None, None)


@dataclass(frozen=True, slots=True)
class _Range:
    n: int
    mean: float
    low: float
    high: float

    def width(self, bins: int) -> float:
        return (self.high - self.low) / bins


def _single(r: _Range, bins: int) -> Distribution:
    """One value: a single bar in the middle of a unit range around it."""
    edges = [r.low - 0.5 + i / bins for i in range(bins + 1)]
    counts = [0] * bins
    counts[bins // 2] = r.n
    return Distribution(r.n, r.mean, r.low, r.high, Histogram(edges[0], edges[-1], edges, counts))


def _binned(r: _Range, counts: list[int], bins: int) -> Distribution:
    edges = [r.low + i * r.width(bins) for i in range(bins + 1)]
    return Distribution(r.n, r.mean, r.low, r.high, Histogram(r.low, r.high, edges, counts))


def distributions(
    session: Session, columns: dict[str, Any], where: list[Any], bins: int = BINS
) -> dict[str, Distribution]:
    """The distribution of each expression of `columns` over the rows `where` selects (NULLs
    left out), in two scans whatever the number of columns: their counts, ranges and sums, then
    the rows counted per combination of bins (at most bins ** len(columns) rows back; keep
    `columns` to two)."""
    values = {name: cast(expr, Float) for name, expr in columns.items()}
    aggregates = [
        agg(v) for v in values.values() for agg in (func.count, func.min, func.max, func.sum)
    ]
    row = session.execute(select(*aggregates).where(*where)).one()
    ranges: dict[str, _Range] = {}
    for i, name in enumerate(values):
        n, low, high, total = row[4 * i : 4 * i + 4]
        if n:
            ranges[name] = _Range(int(n), float(total) / n, float(low), float(high))
    varied = [name for name, r in ranges.items() if r.low != r.high]
    counts = {name: [0] * bins for name in varied}
    if varied:
        indexes = []
        for name in varied:
            v, r = values[name], ranges[name]
            indexes.append(
                case(
                    (v >= r.high, bins - 1),
                    else_=floor_of(session, (v - r.low) / r.width(bins)),
                )
            )
        query = select(*indexes, func.count()).where(*where).group_by(*indexes)
        for found in session.execute(query).tuples():
            for name, index in zip(varied, found[:-1], strict=True):
                if index is not None:
                    counts[name][min(bins - 1, max(0, int(index)))] += int(found[-1])
    out = {}
    for name in values:
        if name not in ranges:
            out[name] = EMPTY
        elif name in counts:
            out[name] = _binned(ranges[name], counts[name], bins)
        else:
            out[name] = _single(ranges[name], bins)
    return out


def distribution_of(values: Sequence[float], bins: int = BINS) -> Distribution:
    """The same, for values already aggregated per rollout (at most one per rollout)."""
    if not values:
        return EMPTY
    r = _Range(len(values), math.fsum(values) / len(values), min(values), max(values))
    if r.low == r.high:
        return _single(r, bins)
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int((v - r.low) / r.width(bins))))] += 1
    return _binned(r, counts, bins)
