"""The sweeper's `/metrics` (`POLAR_MQ_SWEEPER_METRICS_PORT`): what each sweep changed.

`polar_sweeper_rollouts_total{action}` counts rollouts restarted from prepare after their worker
was lost (`requeued`), resumed (`resumed`), given up (`failed`), re-sent after a lost message
(`republished`) and admitted (`admitted`), summed over this process's sweeps; several sweepers
each count their own. `polar_sweeper_sweeps_total` shows it is alive (a failed sweep is logged,
not counted).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server

from polar_mq.config import Settings

log = logging.getLogger(__name__)
ACTIONS = ("requeued", "resumed", "failed", "republished", "admitted")


@dataclass(frozen=True)
class SweeperMetrics:
    registry: CollectorRegistry
    rollouts: Counter
    sweeps: Counter


@cache
def sweeper_metrics() -> SweeperMetrics:
    """This process's sweeper counters (every action present from the start, at 0)."""
    registry = CollectorRegistry(auto_describe=True)
    rollouts = Counter(
        "polar_sweeper_rollouts",
        "Rollouts the sweeper moved, by action (requeued: restarted after a lost worker)",
        ["action"],
        registry=registry,
    )
    for action in ACTIONS:
        rollouts.labels(action)
    sweeps = Counter("polar_sweeper_sweeps", "Sweeps run", registry=registry)
    return SweeperMetrics(registry, rollouts, sweeps)


def observe_sweep(report: Any) -> None:
    """Count one sweep's report (`workers.sweeper.SweepReport`)."""
    metrics = sweeper_metrics()
    metrics.sweeps.inc()
    for action in ACTIONS:
        count = int(getattr(report, action, 0) or 0)
        if count:
            metrics.rollouts.labels(action).inc(count)


def serve_sweeper_metrics(settings: Settings) -> bool:
    """Serve the counters when `POLAR_MQ_SWEEPER_METRICS_PORT` is set; whether it was."""
    port = settings.sweeper_metrics_port
    if port is None:
        return False
    start_http_server(port, settings.metrics_host, sweeper_metrics().registry)
    log.info("sweeper metrics on http://%s:%d/metrics", settings.metrics_host, port)
    return True
