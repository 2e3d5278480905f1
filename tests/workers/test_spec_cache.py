"""SpecCache: one query per job/task, bounded size."""

from __future__ import annotations

import uuid
from typing import Any

from polar_mq.lifecycle.transitions import RolloutRef
from polar_mq.spec import JobSpec, TaskInstance
from polar_mq.workers import spec_cache
from polar_mq.workers.spec_cache import SpecCache


def _ref(job: uuid.UUID, task: int) -> RolloutRef:
    return RolloutRef(uuid.uuid4(), job, task, 0, 0, 1, None, None, None, None)


def test_loads_once_per_task_and_stays_bounded(monkeypatch: Any) -> None:
    loads: list[int] = []

    def fake_load(_session: Any, rollout: RolloutRef) -> tuple[JobSpec, TaskInstance]:
        loads.append(rollout.task_id)
        return JobSpec(model=str(rollout.job_id)), TaskInstance.of({"task": rollout.task_id})

    monkeypatch.setattr(spec_cache, "load_spec_and_task", fake_load)
    cache = SpecCache(max_jobs=4, max_tasks=4)
    job = uuid.uuid4()
    for _ in range(3):
        assert cache(None, _ref(job, 1)) == (JobSpec(model=str(job)), TaskInstance.of({"task": 1}))  # type: ignore[arg-type]
    assert loads == [1]
    for task in range(2, 12):
        cache(None, _ref(job, task))  # type: ignore[arg-type]
    assert len(cache.tasks) <= 4 and len(cache.jobs) <= 4
    assert loads == list(range(1, 12))
