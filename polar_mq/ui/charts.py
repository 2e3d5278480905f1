"""The numbers behind the dashboard's inline SVG charts (the templates only draw rectangles).

Charts are computed on the server as plain coordinates: no chart library, no JavaScript, and a
page that renders the same in a browser, a screenshot or a test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

HIST_BINS = 10


@dataclass(frozen=True, slots=True)
class Histogram:
    """Counts of rewards in equal bins over [low, high] (one bin per value when few values)."""

    low: float
    high: float
    edges: list[float]
    counts: list[int]

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    def bars(self, width: float, height: float) -> list[tuple[float, float, float, float, str]]:
        """(x, y, w, h, label) of each non-empty bar, scaled to the chart's box."""
        if not self.counts or self.peak == 0:
            return []
        w = width / len(self.counts)
        out = []
        for i, count in enumerate(self.counts):
            if not count:
                continue
            h = height * count / self.peak
            label = f"{self.edges[i]:.3g}..{self.edges[i + 1]:.3g}: {count}"
            out.append((i * w + 0.5, height - h, max(w - 1.0, 1.0), h, label))
        return out


def reward_scale(rewards: Sequence[float]) -> tuple[float, float]:
    """The [low, high] every group's histogram of a job shares, so they compare at a glance."""
    finite = [r for r in rewards if math.isfinite(r)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if low == high:
        return low - 0.5, high + 0.5
    return low, high


def histogram(
    rewards: Sequence[float], low: float, high: float, bins: int = HIST_BINS
) -> Histogram:
    step = (high - low) / bins
    edges = [low + i * step for i in range(bins + 1)]
    counts = [0] * bins
    for r in rewards:
        if not math.isfinite(r):
            continue
        index = min(bins - 1, max(0, int((r - low) / step))) if step > 0 else 0
        counts[index] += 1
    return Histogram(low, high, edges, counts)


@dataclass(frozen=True, slots=True)
class Progress:
    """Finished rollouts over time: a step polyline's points in a `width` x `height` box."""

    points: str
    total_s: float
    finished: int


def progress(
    created_at: datetime, finish_times: Sequence[datetime], width: int, height: int, total: int
) -> Progress | None:
    if not finish_times or total <= 0:
        return None
    span = max((finish_times[-1] - created_at).total_seconds(), 1e-3)
    step = max(1, len(finish_times) // 400)  # at most ~400 points, whatever the job's size
    coords = [f"0,{height}"]
    y_before = float(height)
    for i in range(0, len(finish_times), step):
        x = (finish_times[i] - created_at).total_seconds() / span * width
        y = height - (i + 1) / total * height
        coords.append(f"{x:.1f},{y_before:.1f} {x:.1f},{y:.1f}")  # a step: flat until it moves
        y_before = y
    last_y = height - len(finish_times) / total * height
    coords.append(f"{width},{last_y:.1f}")
    return Progress(" ".join(coords), span, len(finish_times))


@dataclass(frozen=True, slots=True)
class StageLines:
    """Rollouts running in each stage over time: one polyline per stage in a `width` x `height`
    box, all on one vertical scale (`peak`)."""

    lines: dict[str, str]
    peak: int
    total_s: float


def stage_lines(
    intervals: Sequence[tuple[str, datetime, datetime | None]],
    stages: Sequence[str],
    now: datetime,
    width: int,
    height: int,
    points: int = 160,
) -> StageLines | None:
    """Sample each stage's number of running rollouts at `points` instants (an open run lasts
    until `now`)."""
    if not intervals:
        return None
    start = min(began for _, began, _ in intervals)
    end = max(ended or now for _, _, ended in intervals)
    span = max((end - start).total_seconds(), 1e-3)
    counts = {stage: [0] * points for stage in stages}
    for stage, began, ended in intervals:
        if stage not in counts:
            continue
        first = int((began - start).total_seconds() / span * (points - 1))
        last = int(((ended or now) - start).total_seconds() / span * (points - 1))
        row = counts[stage]
        for i in range(max(first, 0), min(last, points - 1) + 1):
            row[i] += 1
    peak = max((max(row) for row in counts.values()), default=0) or 1
    lines = {
        stage: " ".join(
            f"{i / (points - 1) * width:.1f},{height - n / peak * height:.1f}"
            for i, n in enumerate(row)
        )
        for stage, row in counts.items()
    }
    return StageLines(lines, peak, span)
