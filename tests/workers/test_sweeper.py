"""The sweeper against the database: expired leases restarted or resumed, lost messages sent
again only when their queue is known to be empty. Time is passed in (`sweep_once(now)`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, claim
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.workers.sweeper import QueueDepth, Sweeper

LATER = timedelta(hours=1)
"""Past every lease and every republish delay."""


@pytest.fixture()
def sent(db_session_factory: sessionmaker[Session]) -> list[StageMessage]:
    messages: list[StageMessage] = []

    def publish(batch: Sequence[StageMessage]) -> None:
        messages.extend(batch)

    attach_publisher(db_session_factory, publish)
    return messages


def _sweeper(factory: sessionmaker[Session], depth: QueueDepth) -> Sweeper:
    return Sweeper(Settings(), factory, depth, name="sweeper-test")


def _rollout(factory: sessionmaker[Session], status: str | None = None) -> uuid.UUID:
    spec = JobCreate.model_validate({"tasks": [{"instruction": "x"}], "priority": 3})
    with unit_of_work(factory) as session:
        rid = create_job(session, spec, "p").rollout_ids[0]
        if status is not None:
            session.execute(update(Rollout).where(Rollout.id == rid).values(status=status))
    return rid


def _claim(factory: sessionmaker[Session], rid: uuid.UUID, stage: Stage) -> None:
    with unit_of_work(factory) as session:
        assert isinstance(claim(session, stage, rid, "dead-worker", 30), Claimed)


def _row(factory: sessionmaker[Session], rid: uuid.UUID) -> tuple[str, int]:
    with factory() as session:
        row = session.get_one(Rollout, rid)
        return str(row.status), row.attempt


def test_an_expired_prepare_lease_starts_a_new_attempt(
    db_session_factory: sessionmaker[Session], sent: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory)
    _claim(db_session_factory, rid, Stage.PREPARE)
    sent.clear()
    sweeper = _sweeper(db_session_factory, lambda _queue: None)  # broker depth unknown
    assert sweeper.sweep_once(utcnow()).changed == 0  # the lease is still running
    report = sweeper.sweep_once(utcnow() + LATER)
    assert (report.requeued, report.republished) == (1, 0)
    assert _row(db_session_factory, rid) == (RolloutStatus.QUEUED, 2)
    assert sent == [StageMessage(Stage.PREPARE, rid, "p", attempt=2, priority=3)]


def test_an_expired_build_lease_is_resumed_in_the_same_attempt(
    db_session_factory: sessionmaker[Session], sent: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory, status=RolloutStatus.RAN)
    _claim(db_session_factory, rid, Stage.BUILD)
    sent.clear()
    report = _sweeper(db_session_factory, lambda _queue: None).sweep_once(utcnow() + LATER)
    assert report.resumed == 1
    assert _row(db_session_factory, rid) == (RolloutStatus.RAN, 1)
    assert sent == [StageMessage(Stage.BUILD, rid, "p", attempt=1, priority=3)]


def test_a_lost_message_is_sent_again_only_to_an_empty_queue(
    db_session_factory: sessionmaker[Session], sent: list[StageMessage]
) -> None:
    rid = _rollout(db_session_factory)
    sent.clear()
    depths: dict[str, int | None] = {"polar.prepare.p": 2}
    sweeper = _sweeper(db_session_factory, lambda queue: depths.get(queue))
    assert sweeper.sweep_once(utcnow() + LATER).republished == 0  # messages are waiting
    depths["polar.prepare.p"] = None
    assert sweeper.sweep_once(utcnow() + LATER).republished == 0  # the broker cannot say
    depths["polar.prepare.p"] = 0
    assert sweeper.sweep_once(utcnow()).republished == 0  # not waiting long enough yet
    report = sweeper.sweep_once(utcnow() + LATER)
    assert report.republished == 1
    assert sent == [StageMessage(Stage.PREPARE, rid, "p", attempt=1, priority=3)]
    # its `republished` event rate-limits the next attempt
    assert sweeper.sweep_once(utcnow() + LATER).republished == 0
