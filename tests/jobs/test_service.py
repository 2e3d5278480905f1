"""create_job: rows in one transaction, messages only after commit, idempotency keys."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, Job, Rollout
from tests.conftest import module_database

pg_url, pg_engine = module_database("polar_mq_job_service")  # it counts every row


def _spec(**kw: object) -> JobCreate:
    return JobCreate.model_validate(
        {"tasks": [{"instruction": "a"}, {"instruction": "b"}], "samples_per_task": 3, **kw}
    )


def test_rows_then_messages_after_commit(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    with unit_of_work(db_session_factory) as session:
        job = create_job(session, _spec(), "gpu")
        assert published == []  # nothing leaves before COMMIT
    assert len(job.rollout_ids) == 6
    assert [m.rollout_id for m in published] == job.rollout_ids
    assert {(m.stage, m.pool, m.node) for m in published} == {(Stage.PREPARE, "gpu", None)}
    with db_session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Rollout)) == 6
        assert session.scalar(select(func.count()).select_from(Event)) == 6


def test_rollback_publishes_nothing(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    with pytest.raises(RuntimeError), unit_of_work(db_session_factory) as session:
        create_job(session, _spec(), "gpu")
        raise RuntimeError("boom")
    assert published == []
    with db_session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0
    # a later, unrelated commit of the same factory sends nothing stale
    with unit_of_work(db_session_factory) as session:
        session.execute(select(1))
    assert published == []


def test_idempotency_key_returns_the_same_job(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    with unit_of_work(db_session_factory) as session:
        first = create_job(session, _spec(idempotency_key="k1"), "gpu")
    with unit_of_work(db_session_factory) as session:
        second = create_job(session, _spec(idempotency_key="k1"), "gpu")
    assert second.job_id == first.job_id
    assert second.rollout_ids == first.rollout_ids
    assert not second.created
    assert len(published) == 6
