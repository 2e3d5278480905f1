"""The four Celery stage tasks. Thin on purpose: a rollout id in, `run_stage` does the rest."""

from __future__ import annotations

import os
from typing import Any

from celery import Task, shared_task

from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.celery_app import PolarCelery, publish_messages
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.runner import run_stage

_contexts: dict[tuple[int, int], WorkerContext] = {}


class StageTask(Task):
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


def _stage_task(stage: Stage) -> Any:
    @shared_task(bind=True, base=StageTask, name=stage.task_name)
    def task(self: StageTask, rollout_id: str, attempt: int | None = None, retries: int = 0) -> str:
        return run_stage(self.context, stage, rollout_id, self.request.id, attempt, retries)

    return task


prepare = _stage_task(Stage.PREPARE)
run_agent = _stage_task(Stage.RUN_AGENT)
build = _stage_task(Stage.BUILD)
evaluate = _stage_task(Stage.EVALUATE)
