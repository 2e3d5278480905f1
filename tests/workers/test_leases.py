"""Lease heartbeats on a real PostgreSQL: a rollout taken from its worker triggers `on_lost`; the
stage's own finishing commit, racing a heartbeat, never does (it used to destroy the runtime the
next stage needed)."""

from __future__ import annotations

import uuid

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, claim, finish
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.workers.leases import LeaseKeeper


def _claimed(factory: sessionmaker[Session]) -> Claimed:
    with unit_of_work(factory) as session:
        job = create_job(session, JobCreate.model_validate({"tasks": [{"instruction": "x"}]}), "p")
    with unit_of_work(factory) as session:
        won = claim(session, Stage.PREPARE, job.rollout_ids[0], "w1", 60)
    assert isinstance(won, Claimed)
    return won


def test_a_cancelled_rollout_is_reported_lost_once(
    db_session_factory: sessionmaker[Session],
) -> None:
    claimed = _claimed(db_session_factory)
    keeper = LeaseKeeper(db_session_factory, lease_s=60)
    calls: list[uuid.UUID] = []
    with keeper.hold(claimed, lambda: calls.append(claimed.rollout.id)) as held:
        keeper.renew([held])
        assert calls == [] and not held.lost.is_set()
        with unit_of_work(db_session_factory) as session:
            session.execute(
                update(Rollout)
                .where(Rollout.id == claimed.rollout.id)
                .values(status=RolloutStatus.CANCELLED)
            )
        keeper.renew([held])
        keeper.renew([held])
    assert calls == [claimed.rollout.id] and held.lost.is_set()


def test_a_heartbeat_after_the_stage_own_finish_commit_is_not_a_loss(
    db_session_factory: sessionmaker[Session],
) -> None:
    claimed = _claimed(db_session_factory)
    keeper = LeaseKeeper(db_session_factory, lease_s=60)
    calls: list[str] = []
    with keeper.hold(claimed, lambda: calls.append("destroy runtime")) as held:
        held.settle()  # the stage's work is done; its outcome is being committed
        with unit_of_work(db_session_factory) as session:
            finish(session, claimed, {}, {}, {}, None)
        keeper.renew([held])  # a heartbeat that raced the commit finds the rollout moved on
    assert calls == [] and not held.lost.is_set()
    with unit_of_work(db_session_factory) as session:
        assert session.get_one(Rollout, claimed.rollout.id).status == RolloutStatus.PREPARED
