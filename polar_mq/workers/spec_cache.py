"""A per-process cache of job specs and task instances, which never change after submission.

Every stage of every rollout needs its job's spec and its task; caching them saves a query per stage
(a job's tasks are handled by the same few workers many times over: samples_per_task x 4 stages).
"""

from __future__ import annotations

import uuid
from typing import Any

from polar_mq.lifecycle.transitions import Db, RolloutRef, load_spec_and_task
from polar_mq.spec import JobSpec, TaskInstance


class SpecCache:
    """Bounded: when a map is full its oldest half is dropped (insertion order)."""

    def __init__(self, max_jobs: int = 1024, max_tasks: int = 65_536) -> None:
        self.max_jobs = max_jobs
        self.max_tasks = max_tasks
        self.jobs: dict[uuid.UUID, JobSpec] = {}
        self.tasks: dict[int, TaskInstance] = {}

    def __call__(self, db: Db, rollout: RolloutRef) -> tuple[JobSpec, TaskInstance]:
        """The typed spec (parsed and upgraded once per job and process) and the task's view
        (built once per task and process)."""
        spec = self.jobs.get(rollout.job_id)
        instance = self.tasks.get(rollout.task_id)
        if spec is None or instance is None:
            spec, instance = load_spec_and_task(db, rollout)
            _put(self.jobs, rollout.job_id, spec, self.max_jobs)
            _put(self.tasks, rollout.task_id, instance, self.max_tasks)
        return spec, instance


def _put(cache: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    if len(cache) >= limit:
        for old in list(cache)[: limit // 2]:
            cache.pop(old, None)
    cache[key] = value
