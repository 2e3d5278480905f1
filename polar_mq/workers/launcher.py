"""`polar-mq worker`: one Celery worker process per stage, each with its own queue and concurrency.

Separate processes per stage give each stage its own concurrency (agent slots vs. prepare slots) and
keep a slow stage from starving the others; they are plain `celery worker` processes, so scaling out
is starting the same command on more nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polar_mq.config import Settings
from polar_mq.workers.routing import Stage, queue_name

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


def spawn(
    workers: Sequence[StageWorker], env: Mapping[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(w.argv(), env=dict(env or os.environ)) for w in workers]


def supervise(procs: Sequence[subprocess.Popen[bytes]]) -> int:
    """Run until a signal or a child exits; then stop all children warmly (SIGTERM) and wait."""
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    code = 0
    while not stopping:
        for proc in procs:
            if proc.poll() is not None:
                code = proc.returncode or 1
                stopping = True
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return code
