"""Helpers for the API tests: a recording publisher and hand-written rollout progress.

Rollout progress is inserted directly (events, LLM calls, trajectory samples, evaluations, status
updates) the way the stage workers write it, so the read side is tested without running stages.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.models import (
    Evaluation,
    Event,
    EventKind,
    Job,
    JobTask,
    LlmCall,
    Rollout,
    RolloutStatus,
    TrajectorySample,
)
from polar_mq.models.base import utcnow

REDIS_URL = os.environ.get("POLAR_MQ_TEST_REDIS", "redis://127.0.0.1:6379")
STAGES = ("prepare", "run_agent", "build", "evaluate")


class RecordingPublisher:
    """Records stage messages; notes any rollout not yet committed when its message is sent."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory
        self.messages: list[StageMessage] = []
        self.unseen_at_publish: list[uuid.UUID] = []

    def __call__(self, messages: Sequence[StageMessage]) -> None:
        ids = [m.rollout_id for m in messages]
        with self.factory() as session:
            seen = set(session.scalars(select(Rollout.id).where(Rollout.id.in_(ids))))
        self.unseen_at_publish.extend(i for i in ids if i not in seen)
        self.messages.extend(messages)


def row_counts(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model)) or 0
            for model in (Job, JobTask, Rollout, Event)
        }


def rollout_ids(factory: sessionmaker[Session], job_id: str) -> list[list[uuid.UUID]]:
    """The rollout ids of a job, grouped by task_index."""
    with factory() as session:
        rows = session.execute(
            select(Rollout.task_index, Rollout.id)
            .where(Rollout.job_id == uuid.UUID(job_id))
            .order_by(Rollout.task_index, Rollout.sample_index)
        ).all()
    groups: dict[int, list[uuid.UUID]] = {}
    for task_index, rid in rows:
        groups.setdefault(task_index, []).append(rid)
    return [groups[i] for i in sorted(groups)]


def set_status(factory: sessionmaker[Session], rollout_id: uuid.UUID, status: str) -> None:
    with unit_of_work(factory) as session:
        session.execute(update(Rollout).where(Rollout.id == rollout_id).values(status=status))


def _event(rollout: Rollout, stage: str, kind: str, at: datetime, **detail: object) -> Event:
    return Event(
        job_id=rollout.job_id, rollout_id=rollout.id, stage=stage, kind=kind,
        attempt=rollout.attempt, worker="test-node", at=at, detail=detail,
    )  # fmt: skip


def complete_rollout(
    factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    reward: float | None = 1.0,
    finished_at: datetime | None = None,
    n_calls: int = 2,
    policy_version: int | None = None,
) -> None:
    """Walk a rollout through all four stages as the workers would record it.

    `policy_version` (default 3, unnamed in the samples' meta) is stamped on the calls and, when
    given, named in the samples' meta as the per_call builder does."""
    end = finished_at or utcnow()
    start = end - timedelta(seconds=10)
    with unit_of_work(factory) as session:
        rollout = session.get_one(Rollout, rollout_id)
        for i, stage in enumerate(STAGES):
            began = start + timedelta(seconds=2 * i)
            session.add(_event(rollout, stage, EventKind.STARTED, began))
            done = began + timedelta(seconds=1.5)
            session.add(_event(rollout, stage, EventKind.FINISHED, done, duration_s=1.5))
        for seq in range(n_calls):
            session.add(
                LlmCall(
                    id=uuid.uuid4(),
                    rollout_id=rollout_id,
                    seq=seq,
                    backend="fake",
                    model="m",
                    api_type="chat",
                    stream=False,
                    policy_version=3 if policy_version is None else policy_version,
                    status_code=200,
                    complete=True,
                    request={"messages": [{"role": "user", "content": f"q{seq}"}]},
                    response={"choices": [{"message": {"content": f"a{seq}"}}]},
                    prompt_ids=[1, 2, 3 + seq],
                    completion_ids=[7, 8],
                    logprobs=[-0.5, -0.25],
                    finish_reason="stop",
                    latency_ms=12.5,
                    ttft_ms=3.0,
                    created_at=start,
                )
            )
            session.add(
                TrajectorySample(
                    rollout_id=rollout_id,
                    attempt=rollout.attempt,
                    sample_index=seq,
                    builder="per_call",
                    prompt_ids=[1, 2, 3 + seq],
                    response_ids=[7, 8],
                    loss_mask=[1, 1],
                    logprobs=[-0.5, -0.25],
                    messages=[],
                    meta={"calls": [seq]}
                    if policy_version is None
                    else {"calls": [seq], "policy_versions": [policy_version]},
                )
            )
        session.add(
            Evaluation(
                rollout_id=rollout_id,
                attempt=rollout.attempt,
                evaluator="completed",
                reward=reward,
                detail={"why": "exit 0"},
            )
        )
        rollout.status = RolloutStatus.COMPLETED
        rollout.termination_reason = "completed"
        rollout.reward = reward
        rollout.n_llm_calls = n_calls
        rollout.node = "test-node"
        rollout.started_at = start
        rollout.finished_at = end


def fail_rollout(
    factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    reason: str = "runtime_error",
    finished_at: datetime | None = None,
) -> None:
    """End a rollout in run_agent with an infrastructure failure (no reward)."""
    end = finished_at or utcnow()
    with unit_of_work(factory) as session:
        rollout = session.get_one(Rollout, rollout_id)
        session.add(_event(rollout, "run_agent", EventKind.STARTED, end - timedelta(seconds=1)))
        session.add(_event(rollout, "run_agent", EventKind.FAILED, end, reason=reason))
        rollout.status = RolloutStatus.FAILED
        rollout.termination_reason = reason
        rollout.error = "container vanished"
        rollout.finished_at = end


def task_instances(factory: sessionmaker[Session], job_id: str) -> list[dict[str, object]]:
    with factory() as session:
        return list(
            session.scalars(
                select(JobTask.instance)
                .where(JobTask.job_id == uuid.UUID(job_id))
                .order_by(JobTask.task_index)
            )
        )
