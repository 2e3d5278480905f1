"""The four stages in a loop in this one process: no Celery, no proxy, no other worker.

`python -m bench.pipeline.inprocess --rollouts 200 [--profile out.pstats]` submits no-op rollouts
(the agent is `true`), then runs each stage message in turn through `runner.run_stage`, as a stage
worker would, and prints the CPU of this process per stage and rollout (`time.process_time`
around each stage: every thread of this process, not the agent child). What it leaves out, on
purpose, is everything the full bench adds around a stage (Celery's consumer, the broker): so a
change to polar_mq's own per-stage path shows here in a few seconds and with little noise, and
`--profile` attributes it with cProfile (which sees one thread only: this one, where stages run).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench.pipeline.infra import fresh_database, stack_settings
from bench.pipeline.measure import NOOP_HARNESS, job_spec
from bench.pipeline.run import DEFAULT_PG, DEFAULT_REDIS, GROUP
from polar_mq.config import get_settings
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import settings_env
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.runner import run_stage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline.inprocess")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile stats to this file")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG)
    opts = parser.parse_args(argv)
    tag = uuid.uuid4().hex[:8]
    with (
        tempfile.TemporaryDirectory(prefix=f"polar-inprocess-{tag}-") as tmp,
        fresh_database(opts.pg_admin_url) as (db_url, _),
    ):
        settings = stack_settings(tag, db_url, opts.redis_url, Path(tmp), free_port())
        os.environ.update(settings_env(settings))  # what a stage worker's process is given
        get_settings.cache_clear()
        queue: collections.deque[StageMessage] = collections.deque()

        def publish(messages: Sequence[StageMessage]) -> None:
            queue.extend(messages)

        ctx = WorkerContext(settings, publish)
        profiler = cProfile.Profile(time.thread_time) if opts.profile else None
        _run(ctx, queue, opts.warmup, None)
        runs = [_run(ctx, queue, opts.rollouts, profiler) for _ in range(opts.repeats)]
        print(f"{opts.rollouts} no-op rollouts x {opts.repeats} runs, CPU ms per rollout:")
        for stage in [*Stage, "total"]:
            values = [r[str(stage)] for r in runs]
            each = " / ".join(f"{v:.2f}" for v in values)
            print(f"  {stage!s:<10} {statistics.median(values):6.2f}   ({each})")
        ctx.session_factory.kw["bind"].dispose()
        if profiler is not None:
            profiler.dump_stats(opts.profile)
            print(f"profile: {opts.profile}")
    return 0


def _run(
    ctx: WorkerContext,
    queue: collections.deque[StageMessage],
    n: int,
    profiler: cProfile.Profile | None,
) -> dict[str, float]:
    """Submit `n` no-op rollouts and run every stage message until the queue is empty."""
    spec = JobCreate.model_validate(job_spec(-(-n // GROUP) * GROUP, NOOP_HARNESS, "ip", GROUP))
    with unit_of_work(ctx.session_factory) as session:
        rollouts = len(create_job(session, spec, ctx.settings.pool).rollout_ids)
    cpu: dict[str, float] = collections.defaultdict(float)
    outcomes: collections.Counter[str] = collections.Counter()
    while queue:
        msg = queue.popleft()
        if msg.countdown:
            time.sleep(msg.countdown)
        task_id = uuid.uuid4().hex
        if profiler is not None:
            profiler.enable()
        t0 = time.process_time()
        outcome = run_stage(ctx, msg.stage, str(msg.rollout_id), task_id, msg.attempt, msg.retries)
        cpu[msg.stage.value] += time.process_time() - t0
        if profiler is not None:
            profiler.disable()
        outcomes[outcome.kind.value] += 1
    if set(outcomes) != {"done"} or outcomes["done"] != 4 * rollouts:
        raise RuntimeError(f"not every stage ended done: {dict(outcomes)}")
    result = {k: 1000.0 * v / rollouts for k, v in cpu.items()}
    result["total"] = sum(result.values())
    return result


if __name__ == "__main__":
    raise SystemExit(main())
