"""Lease heartbeats on a real PostgreSQL: a rollout taken from its worker triggers `on_lost`; the
stage's own finishing commit, racing a heartbeat, never does (it used to destroy the runtime the
next stage needed)."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
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


def _cancel(factory: sessionmaker[Session], claimed: Claimed) -> None:
    with unit_of_work(factory) as session:
        session.execute(
            update(Rollout)
            .where(Rollout.id == claimed.rollout.id)
            .values(status=RolloutStatus.CANCELLED)
        )


@pytest.mark.parametrize("heartbeat", ["renew", "check"])
def test_a_cancelled_rollout_is_reported_lost_once(
    heartbeat: str, db_session_factory: sessionmaker[Session]
) -> None:
    """By a renewal, or by the check the keeper makes between renewals (a read only)."""
    claimed = _claimed(db_session_factory)
    keeper = LeaseKeeper(db_session_factory, lease_s=60)
    beat = getattr(keeper, heartbeat)
    calls: list[uuid.UUID] = []
    with keeper.hold(claimed, lambda: calls.append(claimed.rollout.id)) as held:
        with db_session_factory() as session:
            expires = session.get_one(Rollout, claimed.rollout.id).lease_expires_at
        beat([held])
        assert calls == [] and not held.lost.is_set() and not keeper.lost(claimed.rollout.id)
        with db_session_factory() as session:
            renewed = session.get_one(Rollout, claimed.rollout.id).lease_expires_at != expires
        assert renewed == (heartbeat == "renew")
        _cancel(db_session_factory, claimed)
        beat([held])
        beat([held])
        assert keeper.lost(claimed.rollout.id)
    assert calls == [claimed.rollout.id] and held.lost.is_set()


@pytest.mark.parametrize("heartbeat", ["renew", "check"])
def test_a_heartbeat_after_the_stage_own_finish_commit_is_not_a_loss(
    heartbeat: str, db_session_factory: sessionmaker[Session]
) -> None:
    claimed = _claimed(db_session_factory)
    keeper = LeaseKeeper(db_session_factory, lease_s=60)
    calls: list[str] = []
    with keeper.hold(claimed, lambda: calls.append("destroy runtime")) as held:
        held.settle()  # the stage's work is done; its outcome is being committed
        with unit_of_work(db_session_factory) as session:
            finish(session, claimed, {}, {}, {}, None)
        # a renewal or a check that raced the commit finds the rollout moved on
        getattr(keeper, heartbeat)([held])
    assert calls == [] and not held.lost.is_set()
    with unit_of_work(db_session_factory) as session:
        assert session.get_one(Rollout, claimed.rollout.id).status == RolloutStatus.PREPARED


def test_the_keeper_sees_a_cancel_long_before_its_next_renewal(
    db_session_factory: sessionmaker[Session],
) -> None:
    """Renewals every 20 s (a 60 s lease); the keeper's thread reads every 0.2 s here."""
    claimed = _claimed(db_session_factory)
    keeper = LeaseKeeper(db_session_factory, lease_s=60, check_s=0.2)
    stopped = threading.Event()
    with keeper.hold(claimed, stopped.set):
        _cancel(db_session_factory, claimed)
        assert stopped.wait(10), "the cancel was not seen before the next renewal (20 s)"
