"""Recovery transitions on the database: retry in place, restart with attempt+1, give up once the
attempts are used, resume a DB-only stage, republish; each fenced, so a racing caller loses."""

from __future__ import annotations

import uuid

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.recovery import (
    MAX_BACKOFF_S,
    LostAttempt,
    Recovery,
    backoff_s,
    republish,
    restart,
    restart_claimed,
    resume,
    retry_in_place,
)
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, claim
from polar_mq.models import Event, EventKind, Rollout, RolloutStatus, TerminationReason
from polar_mq.models.base import utcnow


def _rollout(factory: sessionmaker[Session], max_attempts: int = 2) -> uuid.UUID:
    spec = JobCreate.model_validate(
        {
            "tasks": [{"instruction": "x"}],
            "priority": 7,
            "retries": {"max_attempts": max_attempts, "stage_retries": 1},
        }
    )
    with unit_of_work(factory) as session:
        return create_job(session, spec, "p").rollout_ids[0]


def _claim(factory: sessionmaker[Session], rid: uuid.UUID, stage: Stage) -> Claimed:
    with unit_of_work(factory) as session:
        won = claim(session, stage, rid, "w1", 60)
    assert isinstance(won, Claimed), won
    return won


def _lost(factory: sessionmaker[Session], rid: uuid.UUID, max_attempts: int) -> LostAttempt:
    with factory() as session:
        row = session.get_one(Rollout, rid)
        return LostAttempt(
            rid, row.job_id, row.status, row.attempt, row.lease_owner, "p", max_attempts, 7
        )


def _kinds(factory: sessionmaker[Session], rid: uuid.UUID) -> list[str]:
    with factory() as session:
        return list(
            session.scalars(select(Event.kind).where(Event.rollout_id == rid).order_by(Event.id))
        )


def test_backoff() -> None:
    assert [backoff_s(n, 1.0) for n in range(3)] == [1.0, 2.0, 4.0]
    assert backoff_s(20, 1.0) == MAX_BACKOFF_S


def test_retry_in_place_hands_the_stage_back_after_commit(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory)
    won = _claim(db_session_factory, rid, Stage.PREPARE)
    published.clear()
    again = StageMessage(Stage.PREPARE, rid, "p", attempt=1, retries=1, countdown=2.0)
    with unit_of_work(db_session_factory) as session:
        retry_in_place(session, won, again, "boom", 2.0)
        assert published == []
    assert published == [again]
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert (row.status, row.attempt, row.lease_owner) == (RolloutStatus.QUEUED, 1, None)
    assert _kinds(db_session_factory, rid)[-1] == EventKind.RETRIED


def test_restart_starts_a_new_attempt_then_gives_up(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory, max_attempts=2)
    _claim(db_session_factory, rid, Stage.PREPARE)
    published.clear()
    lost = _lost(db_session_factory, rid, max_attempts=2)
    with unit_of_work(db_session_factory) as session:
        outcome = restart(
            session, lost, TerminationReason.WORKER_LOST, "gone", "sweeper", "prepare"
        )
    assert outcome is Recovery.REQUEUED
    assert published == [StageMessage(Stage.PREPARE, rid, "p", attempt=2, priority=7)]
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert (row.status, row.attempt, row.started_at) == (RolloutStatus.QUEUED, 2, None)
    with unit_of_work(db_session_factory) as session:  # the same lost attempt, seen again
        assert restart(session, lost, "worker_lost", "gone", "sweeper", "prepare") is Recovery.RACED

    _claim(db_session_factory, rid, Stage.PREPARE)
    second = _lost(db_session_factory, rid, max_attempts=2)
    with unit_of_work(db_session_factory) as session:
        outcome = restart(session, second, TerminationReason.WORKER_LOST, "gone", "s", "prepare")
    assert outcome is Recovery.FAILED
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert row.status == RolloutStatus.FAILED
        assert row.termination_reason == TerminationReason.WORKER_LOST
        assert row.error is not None and row.error.startswith("gave up after 2 attempt(s)")
    assert _kinds(db_session_factory, rid)[-1] == EventKind.FAILED


def test_restart_claimed_reads_the_jobs_retry_policy(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory, max_attempts=1)
    won = _claim(db_session_factory, rid, Stage.PREPARE)
    with unit_of_work(db_session_factory) as session:
        assert restart_claimed(session, won, "p", "runtime_error", "broken") is Recovery.FAILED


def test_resume_gives_a_db_only_stage_back_in_the_same_attempt(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory)
    with unit_of_work(db_session_factory) as session:
        session.execute(update(Rollout).where(Rollout.id == rid).values(status="ran"))
    _claim(db_session_factory, rid, Stage.BUILD)
    published.clear()
    lost = _lost(db_session_factory, rid, max_attempts=2)
    with unit_of_work(db_session_factory) as session:
        assert resume(session, lost, Stage.BUILD, "sweeper") is Recovery.RESUMED
    assert published == [StageMessage(Stage.BUILD, rid, "p", attempt=1, priority=7)]
    with db_session_factory() as session:
        assert session.get_one(Rollout, rid).status == RolloutStatus.RAN
    with unit_of_work(db_session_factory) as session:
        assert resume(session, lost, Stage.BUILD, "sweeper") is Recovery.RACED


def test_republish_sends_the_message_again_with_an_event(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory)
    published.clear()
    message = StageMessage(Stage.PREPARE, rid, "p", attempt=1, priority=7)
    with db_session_factory() as session:
        job_id = session.get_one(Rollout, rid).job_id
    with unit_of_work(db_session_factory) as session:
        republish(session, message, job_id, "sweeper", utcnow(), "polar.prepare.p")
    assert published == [message]
    assert _kinds(db_session_factory, rid)[-1] == EventKind.REPUBLISHED
