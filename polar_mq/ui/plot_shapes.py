"""Coordinates of the job page's plots (bar series and the reward-per-version chart).

As in `ui.charts`, the server computes plain numbers and the templates draw SVG rectangles and
circles: no chart library, nothing downloaded, the same picture in a browser and in a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polar_mq.ui.job_plots import VersionReward


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    label: str


def series_bars(
    values: Sequence[int], width: float, height: float, bin_s: float, unit: str
) -> list[Bar]:
    """One bar per time bin, scaled to the tallest; the label says the bin and its rate."""
    peak = max(values, default=0)
    if peak <= 0:
        return []
    w = width / len(values)
    out = []
    for i, value in enumerate(values):
        if not value:
            continue
        h = height * value / peak
        rate = value / bin_s if bin_s > 0 else 0.0
        label = f"{i * bin_s:.0f}-{(i + 1) * bin_s:.0f} s: {value} {unit} ({rate:.3g}/s)"
        out.append(Bar(i * w + 0.5, height - h, max(w - 1.0, 1.0), h, label))
    return out


@dataclass(frozen=True, slots=True)
class VersionPoint:
    x: float
    y_mean: float
    y_low: float
    y_high: float
    version: VersionReward


@dataclass(frozen=True, slots=True)
class VersionChart:
    points: list[VersionPoint]
    low: float
    high: float


def version_chart(versions: Sequence[VersionReward], width: float, height: float) -> VersionChart:
    """Mean reward (a dot) and min..max (a line) per policy version, evenly spaced."""
    if not versions:
        return VersionChart([], 0.0, 1.0)
    low = min(v.low for v in versions)
    high = max(v.high for v in versions)
    if low == high:
        low, high = low - 0.5, high + 0.5

    def y(value: float) -> float:
        return height - (value - low) / (high - low) * height

    step = width / len(versions)
    points = [
        VersionPoint(step * (i + 0.5), y(v.mean), y(v.low), y(v.high), v)
        for i, v in enumerate(versions)
    ]
    return VersionChart(points, low, high)
