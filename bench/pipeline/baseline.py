"""The baseline: a raw Celery chain of four no-op tasks, on the same broker and Celery settings.

Each step has its own queue and its own worker process (like polar_mq's one worker per stage),
started with the very argv polar_mq's launcher builds (threads pool, `-O fair`, no gossip/mingle),
only `-A` pointing at `bench.pipeline.baseline_entry`. The Celery configuration that matters for
throughput (late acks, reject on worker lost, prefetch 1, ignored results, JSON, task events,
transport options) is copied from `polar_mq.dispatch.celery_app.create_celery`, so the baseline
follows any change made there. There is no result backend: the last step INCRs a Redis counter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis
from celery import Celery, chain

from bench.pipeline.floor import FloorSteps
from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import create_celery
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.launcher import StageWorker

STEPS = 4
ENTRY_MODULE = "bench.pipeline.baseline_entry"
# The settings of polar_mq's Celery app that the baseline shares.
SHARED_CONF = (
    "task_acks_late",
    "task_reject_on_worker_lost",
    "worker_prefetch_multiplier",
    "task_ignore_result",
    "task_serializer",
    "accept_content",
    "broker_transport_options",
    "broker_connection_retry_on_startup",
    "worker_send_task_events",
    "task_send_sent_event",
    "worker_hijack_root_logger",
)


def step_queue(prefix: str, step: int) -> str:
    return f"{prefix}.baseline.step{step}"


def step_task_name(step: int) -> str:
    return f"bench.baseline.step{step}"


def shared_conf(settings: Settings) -> dict[str, Any]:
    """polar_mq's values of the settings the baseline must share."""
    reference = create_celery(settings)
    try:
        return {key: reference.conf[key] for key in SHARED_CONF}
    finally:
        reference.close()


def create_baseline_app(settings: Settings) -> Celery:
    """The four step tasks. Called without arguments (a raw chain) a step does nothing; with a
    floor mode and an item (`--floors`) it does that floor's work (`bench.pipeline.floor`)."""
    app = Celery("bench_baseline", broker=settings.broker_url)
    app.conf.update(shared_conf(settings))
    app.conf.task_default_queue = f"{settings.queue_prefix}.baseline.default"
    counter: dict[str, redis.Redis] = {}
    floors: dict[str, FloorSteps] = {}

    def _floor(mode: str | None, step: int, item: int) -> None:
        if mode is None:
            return
        steps = floors.get("steps")
        if steps is None:
            steps = floors.setdefault(
                "steps", FloorSteps(settings.database_url, settings.runtime_root)
            )
        steps.run(mode, step, item)

    def _step_task(step: int) -> Any:
        def step_body(mode: str | None = None, item: int = 0) -> None:
            _floor(mode, step, item)

        step_body.__name__ = f"step{step}"
        return step_body

    def _last(counter_key: str, mode: str | None = None, item: int = 0) -> None:
        _floor(mode, STEPS, item)
        client = counter.get("client")
        if client is None:
            client = counter.setdefault("client", redis.Redis.from_url(settings.broker_url))
        client.incr(counter_key)

    for step in range(1, STEPS):
        app.task(name=step_task_name(step), ignore_result=True)(_step_task(step))
    app.task(name=step_task_name(STEPS), ignore_result=True)(_last)
    return app


def make_chain(
    app: Celery, prefix: str, counter_key: str, mode: str | None = None, item: int = 0
) -> Any:
    """One chain of the four steps, each routed to its own queue (a floor's: with its item)."""
    extra: dict[str, Any] = {} if mode is None else {"mode": mode, "item": item}
    sigs = [
        app.signature(step_task_name(step), kwargs=extra, immutable=True).set(
            queue=step_queue(prefix, step)
        )
        for step in range(1, STEPS)
    ]
    last = app.signature(step_task_name(STEPS), args=(counter_key,), kwargs=extra, immutable=True)
    sigs.append(last.set(queue=step_queue(prefix, STEPS)))
    return chain(*sigs)


def submit_chains(
    app: Celery,
    prefix: str,
    counter_key: str,
    n: int,
    mode: str | None = None,
    items: Sequence[int] = (),
) -> None:
    with app.producer_or_acquire() as producer:
        for i in range(n):
            item = items[i] if mode is not None else 0
            make_chain(app, prefix, counter_key, mode, item).apply_async(producer=producer)


def worker_argvs(
    settings: Settings, concurrency: Mapping[Stage, int], pool_impl: str
) -> list[tuple[str, list[str]]]:
    """(name, argv) of one worker per step: polar_mq's worker argv with the baseline app.

    Step i gets the concurrency of polar_mq's i-th stage, so both sides run the same thread count
    per queue.
    """
    result: list[tuple[str, list[str]]] = []
    stages: Sequence[Stage] = tuple(Stage)
    for step, stage in enumerate(stages, start=1):
        argv = StageWorker(
            stage=stage,
            queue=step_queue(settings.queue_prefix, step),
            concurrency=concurrency[stage],
            hostname=f"baseline{step}.{settings.pool}@{settings.node_name}",
            pool_impl=pool_impl,
        ).argv()
        argv[argv.index("polar_mq.workers.entry")] = ENTRY_MODULE
        result.append((f"baseline-step{step}", argv))
    return result
