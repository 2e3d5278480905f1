"""The four Celery stage tasks. Thin on purpose: a rollout id in, `run_stage` does the rest."""

from __future__ import annotations

import os
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Retry

from polar_mq.dispatch.celery_app import PolarCelery, publish_messages
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.run_result import RunKind, RunResult
from polar_mq.workers.runner import run_stage
from polar_mq.workers.waiting_leases import install_waiting_leases

_contexts: dict[tuple[int, int], WorkerContext] = {}


class StageTask(Task):  # type: ignore[misc]  # celery ships no types
    """Gives each task the worker context of its process (built after fork, once per app)."""

    @property
    def context(self) -> WorkerContext:
        app: PolarCelery = self.app
        key = (os.getpid(), id(app))
        if key not in _contexts:
            _contexts[key] = WorkerContext(
                app.polar_settings, lambda msgs: publish_messages(app, msgs)
            )
        return _contexts[key]


class StageNotFinished(Exception):
    """The stage ran and did not finish: the rollout failed, its attempt was given up and started
    over (`restart:requeued`), or its result was discarded (`lease_lost`, e.g. cancelled).

    Raised only after `run_stage` returned, i.e. once that outcome is committed and the next
    message (if any) published: Celery then marks the task FAILURE (Flower shows it as failed,
    not SUCCESS) and still acks the message (late acks ack failures too), so delivery stays
    at-least-once and a redelivered copy finds the rollout moved on and is skipped as before.
    """

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        """`run_stage`'s result as text (the stage metrics label it by its head)."""


class StageRetried(Retry):  # type: ignore[misc]
    """The stage raised and was handed back to its queue (`retry:N`): Celery marks the task RETRY.

    The retry message is already published by `run_stage` (through the outbox, with its
    backoff); raising Celery's `Retry` ourselves, rather than calling `Task.retry`, only sets the
    state and sends nothing.
    """

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


NOT_FINISHED = frozenset({RunKind.FAILED, RunKind.RESTART, RunKind.LEASE_LOST})
"""Kinds of `run_stage` results shown as a failed task (`RETRY` shows as a retried one)."""


def raise_unless_finished(result: RunResult) -> str:
    """`result` as text when the stage finished or skipped a duplicate; else the exception that
    gives the task its true state in Flower and the result backend. Text, not the typed result:
    the result backend stores it and Flower shows it, as they did before it was typed."""
    if result.kind is RunKind.RETRY:
        raise StageRetried(str(result))
    if result.kind in NOT_FINISHED:
        raise StageNotFinished(str(result))
    return str(result)


def _stage_task(stage: Stage) -> Any:
    @shared_task(  # type: ignore[untyped-decorator]
        bind=True, base=StageTask, name=stage.task_name, throws=(StageNotFinished,)
    )
    def task(self: StageTask, rollout_id: str, attempt: int | None = None, retries: int = 0) -> str:
        result = run_stage(self.context, stage, rollout_id, self.request.id, attempt, retries)
        return raise_unless_finished(result)

    return task


prepare = _stage_task(Stage.PREPARE)
run_agent = _stage_task(Stage.RUN_AGENT)
build = _stage_task(Stage.BUILD)
evaluate = _stage_task(Stage.EVALUATE)
install_waiting_leases()  # a dead node's queue does not strand its rollouts
