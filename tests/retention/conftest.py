"""A fresh migrated PostgreSQL database per test (partitions are DDL: no sharing between tests),
and helpers that write calls through the proxy's own batch inserter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.models import Job, JobTask, Rollout, RolloutStatus
from polar_mq.proxy.store.call_insert import CallInserter
from tests.conftest import scratch_database

NOW = datetime.now(UTC)
"""The tests' clock, taken once: their calls' dates and expected partitions are relative to it."""


@pytest.fixture()
def engine() -> Iterator[Engine]:
    """A freshly migrated database. The migration creates the partitions from its own date, so
    a run that crossed midnight UTC after `NOW` was taken would compare the next day's partitions
    with `NOW`'s (seen in CI): that one case is skipped, naming it."""
    if datetime.now(UTC).date() != NOW.date():
        pytest.skip(f"the UTC date changed since the tests' clock was taken ({NOW:%Y-%m-%d})")
    with scratch_database("polar_mq_retention") as url:
        engine = create_db_engine(url)
        yield engine
        engine.dispose()


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def call_row(rollout_id: uuid.UUID, seq: int, created_at: datetime) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(), "rollout_id": rollout_id, "seq": seq, "backend": "b0", "model": "m",
        "api_type": "chat", "stream": False, "policy_version": 0, "status_code": 200,
        "complete": True, "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"choices": []}, "prompt_ids": [1, 2, 3], "completion_ids": [4, 5],
        "logprobs": [-0.5, -0.25], "finish_reason": "stop", "latency_ms": 1.0, "ttft_ms": 0.5,
        "created_at": created_at, "purpose": "agent", "attempt": 1,
    }  # fmt: skip


def insert_calls(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        CallInserter(engine).insert(conn, rows)


def make_job(engine: Engine, statuses: list[str]) -> list[uuid.UUID]:
    """A job with one group per status (one rollout each); returns the rollout ids."""
    factory = make_session_factory(engine)
    job_id = uuid.uuid4()
    ids = []
    with unit_of_work(factory) as session:
        session.add(Job(id=job_id, samples_per_task=1, n_tasks=len(statuses), spec={}))
        session.flush()
        for index, status in enumerate(statuses):
            task = JobTask(job_id=job_id, task_index=index, instance={"instruction": "x"})
            session.add(task)
            session.flush()
            rollout = Rollout(
                job_id=job_id, task_id=task.id, task_index=index, sample_index=0, status=status,
                termination_reason="completed" if status in RolloutStatus.TERMINAL else None,
            )  # fmt: skip
            session.add(rollout)
            session.flush()
            ids.append(rollout.id)
    return ids
