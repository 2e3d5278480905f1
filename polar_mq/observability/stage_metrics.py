"""Metrics of the stage workers: stage durations and queue wait, retries, lost leases, warm hits.

They are recorded by Celery signals around every stage task (`install_stage_signals`, connected
when the Celery app is built) and by the runner for what only it sees (`observe_outcome`). A node
runs several Celery processes (one per stage, each perhaps with prefork children), so these
metrics use prometheus-client's multiprocess mode: `polar-mq worker` points
`PROMETHEUS_MULTIPROC_DIR` of its stage workers at a directory of its own and serves their sum
on one port (`node_metrics`). Without that variable (tests, eager mode) they are ordinary
in-process metrics nobody serves.

The stage's log context (`rollout_id`, `stage`, `attempt`; `job_id` once claimed) is bound in the
same signals, so every line a stage logs names its rollout.

Queue wait is the time from when a message was due (published, plus its retry countdown) to when
its stage started: the publisher stamps `polar_due_at` (wall clock) in the message headers. Nodes'
clocks are assumed in sync (NTP); a negative wait counts as 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass
from functools import cache
from typing import Any

from prometheus_client import Counter, Histogram

from polar_mq.lifecycle.stages import Stage
from polar_mq.observability import context
from polar_mq.runtimes.warm_pool import is_pooled

log = logging.getLogger("polar_mq.workers.stages")
DUE_HEADER = "polar_due_at"
STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
STAGES = {stage.task_name: stage for stage in Stage}


@dataclass(frozen=True)
class StageMetrics:
    duration: Histogram
    queue_wait: Histogram
    leases_lost: Counter
    retries: Counter
    warm_pool: Counter


@cache
def stage_metrics() -> StageMetrics:
    """This process's stage metrics (created once, after a prefork fork if there is one)."""
    metrics = StageMetrics(
        duration=Histogram(
            "polar_stage_duration_seconds",
            "Stage task run time, by stage and outcome (done, failed, retry, restart, "
            "lease_lost, skipped, error)",
            ["stage", "outcome"],
            buckets=STAGE_BUCKETS,
            registry=None,
        ),
        queue_wait=Histogram(
            "polar_stage_queue_wait_seconds",
            "Time a stage message waited in its queue after it was due, by stage",
            ["stage"],
            buckets=WAIT_BUCKETS,
            registry=None,
        ),
        leases_lost=Counter(
            "polar_stage_leases_lost",
            "Stages whose lease was taken (the rollout was cancelled or restarted meanwhile)",
            ["stage"],
            registry=None,
        ),
        retries=Counter(
            "polar_stage_retries",
            "Stage failures retried: in place (same stage) or by restarting the rollout",
            ["stage", "kind"],
            registry=None,
        ),
        warm_pool=Counter(
            "polar_warm_pool_takes",
            "Prepares of warm-pool runtimes: hit (an idle runtime was taken) or miss (built cold)",
            ["result"],
            registry=None,
        ),
    )
    for stage in Stage:  # every series present at 0 from the first stage on, for dashboards
        metrics.leases_lost.labels(stage.value)
        for kind in ("in_place", "restart"):
            metrics.retries.labels(stage.value, kind)
    for result in ("hit", "miss"):
        metrics.warm_pool.labels(result)
    return metrics


def outcome_of(result: object) -> str:
    """The outcome label of a stage task's return value (`runner.run_stage`) or exception (the
    ones `workers.tasks` raises for an outcome carry it as `outcome`)."""
    if isinstance(result, BaseException):
        outcome = getattr(result, "outcome", None)
        if not isinstance(outcome, str):
            return "error"
        result = outcome
    text = str(result)
    head = text.partition(":")[0]
    return (
        head if head in ("done", "failed", "retry", "restart", "lease_lost", "skipped") else "error"
    )


@dataclass(slots=True)
class _Running:
    stage: Stage
    started: float
    token: Token[Mapping[str, Any]]


_running: dict[str, _Running] = {}


def stage_started(task_id: str, task: Any, args: Any, kwargs: Any) -> None:
    """`task_prerun`: bind the log context, observe the queue wait, start the clock."""
    stage = STAGES.get(getattr(task, "name", ""))
    if stage is None:
        return
    rollout_id = args[0] if args else None
    attempt = (kwargs or {}).get("attempt")
    token = context.push(rollout_id=rollout_id, stage=stage.value, attempt=attempt)
    _running[task_id] = _Running(stage, time.perf_counter(), token)
    due = _header(task, DUE_HEADER)
    if due is not None:
        stage_metrics().queue_wait.labels(stage.value).observe(max(0.0, time.time() - due))


def stage_ended(task_id: str, result: object) -> None:
    """`task_postrun`: observe the duration by outcome, count retries and lost leases, log it."""
    running = _running.pop(task_id, None)
    if running is None:
        return
    metrics = stage_metrics()
    stage = running.stage.value
    outcome = outcome_of(result)
    seconds = time.perf_counter() - running.started
    metrics.duration.labels(stage, outcome).observe(seconds)
    log.info("%s %s in %.3f s", stage, result, seconds)  # in the stage's log context
    if outcome == "lease_lost":
        metrics.leases_lost.labels(stage).inc()
    elif outcome == "retry":
        metrics.retries.labels(stage, "in_place").inc()
    elif outcome == "restart":
        metrics.retries.labels(stage, "restart").inc()
    context.pop(running.token)


def observe_outcome(stage: Stage, detail: Mapping[str, Any]) -> None:
    """What only the runner sees: whether a prepare took a warm runtime (hit) or built one."""
    if stage is not Stage.PREPARE:
        return
    runtime = detail.get("runtime")
    if not isinstance(runtime, Mapping):
        return
    source = runtime.get("source")
    if source == "pool":
        stage_metrics().warm_pool.labels("hit").inc()
    elif source == "cold" and is_pooled(str(detail.get("runtime_id") or "")):
        stage_metrics().warm_pool.labels("miss").inc()


def install_stage_signals() -> None:
    """Connect the handlers to Celery's task signals (idempotent: weak=False, one uid)."""
    from celery import signals

    signals.task_prerun.connect(_prerun, weak=False, dispatch_uid="polar_mq.stage_metrics.pre")
    signals.task_postrun.connect(_postrun, weak=False, dispatch_uid="polar_mq.stage_metrics.post")


def _prerun(task_id: str, task: Any, args: Any = None, kwargs: Any = None, **_: Any) -> None:
    stage_started(task_id, task, args, kwargs)


def _postrun(task_id: str, task: Any, retval: object = None, **_: Any) -> None:
    stage_ended(task_id, retval)


def _header(task: Any, name: str) -> float | None:
    request = getattr(task, "request", None)
    value = getattr(request, name, None) if request is not None else None
    if value is None and request is not None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name) if isinstance(headers, Mapping) else None
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
