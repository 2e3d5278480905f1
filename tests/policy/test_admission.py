"""Staleness admission on the database: capacity per policy version, each group admitted once,
prepare messages only for the admitted rollouts and only after commit."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Job, Rollout, RolloutStatus
from polar_mq.policy.admission import admit, admit_all, admitted_groups, capacity_groups
from polar_mq.spec import StoredStaleness


def _submit(factory: sessionmaker[Session], n_tasks: int, samples: int = 2) -> uuid.UUID:
    spec = JobCreate.model_validate(
        {
            "tasks": [{"instruction": f"task {i}"} for i in range(n_tasks)],
            "samples_per_task": samples,
            "staleness": {"max_staleness": 0, "batch_size": 2},
        }
    )
    with unit_of_work(factory) as session:
        return create_job(session, spec, "default").job_id


def _queued_groups(factory: sessionmaker[Session], job_id: uuid.UUID) -> list[int]:
    with factory() as session:
        rows = session.execute(
            select(Rollout.task_index)
            .where(Rollout.job_id == job_id, Rollout.status == RolloutStatus.QUEUED)
            .distinct()
            .order_by(Rollout.task_index)
        ).all()
    return [row.task_index for row in rows]


def test_capacity_formula() -> None:
    spec = StoredStaleness(max_staleness=1, batch_size=4, base_version=2)
    assert capacity_groups(spec, 2) == 8
    assert capacity_groups(spec, 5) == 20
    assert capacity_groups(spec, 0) == 8  # a version before the job's base never shrinks it
    assert capacity_groups(spec.model_copy(update={"max_staleness": 0}), 2) == 4


def test_submit_admits_the_first_batch_in_task_order(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    job_id = _submit(db_session_factory, n_tasks=5)
    assert _queued_groups(db_session_factory, job_id) == [0, 1]
    with db_session_factory() as session:
        queued = set(
            session.scalars(
                select(Rollout.id).where(
                    Rollout.job_id == job_id, Rollout.status == RolloutStatus.QUEUED
                )
            )
        )
        assert admitted_groups(session, job_id) == (2, 0)
    assert {m.rollout_id for m in published} == queued
    assert {m.stage for m in published} == {Stage.PREPARE}


def test_admitting_again_at_the_same_version_admits_nothing(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    job_id = _submit(db_session_factory, n_tasks=5)
    sent = len(published)
    with unit_of_work(db_session_factory) as session:
        assert admit(session, job_id, 0) == 0
        assert admit_all(session, 0, worker="sweeper") == 0
    assert len(published) == sent
    assert _queued_groups(db_session_factory, job_id) == [0, 1]


def test_a_new_policy_version_admits_the_next_batch_with_events(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    job_id = _submit(db_session_factory, n_tasks=5)
    published.clear()
    with unit_of_work(db_session_factory) as session:
        assert admit_all(session, 1, worker="sweeper") == 2
        assert published == []  # the messages wait for the commit
    assert _queued_groups(db_session_factory, job_id) == [0, 1, 2, 3]
    assert len(published) == 4  # two groups of two samples
    with db_session_factory() as session:
        events = session.execute(
            select(Event.worker, Event.detail).where(
                Event.job_id == job_id, Event.kind == EventKind.ADMITTED
            )
        ).all()
    assert sum(1 for e in events if e.worker == "sweeper") == 4
    assert {e.detail["policy_version"] for e in events if e.worker == "sweeper"} == {1}


def test_a_cancelled_job_is_never_admitted(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    job_id = _submit(db_session_factory, n_tasks=5)
    with unit_of_work(db_session_factory) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.cancelled_at = job.created_at
    published.clear()
    with unit_of_work(db_session_factory) as session:
        assert admit(session, job_id, 3) == 0
    assert published == []
