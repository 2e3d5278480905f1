"""`polar-mq worker`: one Celery worker process per stage, each with its own queue and concurrency.

Separate processes per stage give each stage its own concurrency (agent slots vs. prepare slots) and
keep a slow stage from starving the others; they are plain `celery worker` processes, so scaling out
is starting the same command on more nodes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polar_mq.config import Settings
from polar_mq.workers.routing import Stage, queue_name

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = {
    Stage.PREPARE: 2,
    Stage.RUN_AGENT: 8,
    Stage.BUILD: 2,
    Stage.EVALUATE: 2,
}


@dataclass(frozen=True)
class StageWorker:
    stage: Stage
    queue: str
    concurrency: int
    hostname: str
    pool_impl: str

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "polar_mq.workers.entry", "worker",
            "-Q", self.queue, "-c", str(self.concurrency), "-P", self.pool_impl,
            "-n", self.hostname, "-O", "fair", "--without-gossip", "--without-mingle",
            "--loglevel", "WARNING",
        ]  # fmt: skip


def parse_concurrency(spec: str | None) -> dict[Stage, int]:
    """`run_agent=8,prepare=2` → {Stage: int}; missing stages keep their defaults."""
    result = dict(DEFAULT_CONCURRENCY)
    if not spec:
        return result
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        try:
            stage = Stage(name.strip())
            count = int(value)
        except ValueError as exc:
            raise ValueError(
                f"bad concurrency {part!r}; expected stage=N, e.g. run_agent=8"
            ) from exc
        if not sep or count < 1:
            raise ValueError(f"bad concurrency {part!r}; N must be ≥ 1")
        result[stage] = count
    return result


def parse_stages(spec: str) -> list[Stage]:
    try:
        return [Stage(s.strip()) for s in spec.split(",") if s.strip()]
    except ValueError as exc:
        raise ValueError(f"unknown stage in {spec!r}; stages: {', '.join(Stage)}") from exc


def plan_workers(
    settings: Settings, stages: Sequence[Stage], concurrency: Mapping[Stage, int], pool_impl: str
) -> list[StageWorker]:
    node = settings.node_name
    return [
        StageWorker(
            stage=stage,
            queue=queue_name(settings.queue_prefix, stage, settings.pool, node),
            concurrency=concurrency[stage],
            hostname=f"{stage.value}.{settings.pool}@{node}",
            pool_impl=pool_impl,
        )
        for stage in stages
    ]


def spawn_one(worker: StageWorker, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(worker.argv(), env=dict(env or os.environ))


RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
HEALTHY_AFTER_S = 60.0
"""A worker that stayed up this long has its restart backoff reset."""


def supervise(
    workers: Sequence[StageWorker],
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.2,
) -> int:
    """Run the stage workers until SIGTERM/SIGINT, restarting any that exits on its own.

    A Celery worker can die on its own (an unrecoverable broker error, an OOM kill, kill -9);
    its unacked messages are redelivered or recovered by the sweeper, and a fresh process takes
    its place after a backoff, so a node keeps serving every stage. On a signal, every worker gets
    SIGTERM (Celery's warm shutdown: running stages finish) and is waited for.
    """
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    procs = [spawn_one(w, env) for w in workers]
    started = [time.monotonic()] * len(procs)
    failures = [0] * len(procs)
    due: list[float | None] = [None] * len(procs)
    while not stopping:
        now = time.monotonic()
        for i, proc in enumerate(procs):
            if due[i] is None and proc.poll() is not None:
                if now - started[i] > HEALTHY_AFTER_S:
                    failures[i] = 0
                delay = RESTART_BACKOFF_S[min(failures[i], len(RESTART_BACKOFF_S) - 1)]
                failures[i] += 1
                due[i] = now + delay
                log.warning(
                    "%s exited with code %s; restarting in %.0f s",
                    workers[i].hostname, proc.returncode, delay,
                )  # fmt: skip
            restart_at = due[i]
            if restart_at is not None and now >= restart_at:
                procs[i] = spawn_one(workers[i], env)
                started[i] = now
                due[i] = None
        time.sleep(poll_s)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0
