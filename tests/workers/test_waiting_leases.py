"""Rollouts waiting in a node's own queue: stamped while the node's consumer lives, restarted
by the sweeper once the stamp expires (a dead node), left alone when never stamped."""

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
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.workers.sweeper import Sweeper
from polar_mq.workers.waiting_leases import WaitingLeaseKeeper, waiting_states

LATER = timedelta(hours=1)


@pytest.fixture()
def sent(db_session_factory: sessionmaker[Session]) -> list[StageMessage]:
    messages: list[StageMessage] = []

    def publish(batch: Sequence[StageMessage]) -> None:
        messages.extend(batch)

    attach_publisher(db_session_factory, publish)
    return messages


def _waiting(factory: sessionmaker[Session], status: str, node: str = "x") -> uuid.UUID:
    spec = JobCreate.model_validate({"tasks": [{"instruction": "x"}]})
    with unit_of_work(factory) as session:
        rid = create_job(session, spec, "p").rollout_ids[0]
        session.execute(update(Rollout).where(Rollout.id == rid).values(status=status, node=node))
    return rid


def _row(factory: sessionmaker[Session], rid: uuid.UUID) -> tuple[str, int]:
    with factory() as session:
        row = session.get_one(Rollout, rid)
        return str(row.status), row.attempt


def _sweep(factory: sessionmaker[Session], at: timedelta = LATER) -> Sweeper:
    sweeper = Sweeper(Settings(), factory, lambda _queue: 1, name="sweeper-test")
    sweeper.sweep_once(utcnow() + at)
    return sweeper


def test_the_node_queues_a_worker_consumes_name_its_waiting_states() -> None:
    settings = Settings(queue_prefix="q", pool="p", node_name="x")
    assert waiting_states(settings, {"q.run_agent.x", "q.prepare.p"}) == [RolloutStatus.PREPARED]
    assert waiting_states(settings, {"q.evaluate.x"}) == [RolloutStatus.BUILT]
    assert waiting_states(settings, {"q.run_agent.y", "q.build.p"}) == []


def test_a_stamp_that_expires_restarts_the_rollout_elsewhere(
    db_session_factory: sessionmaker[Session], sent: list[StageMessage]
) -> None:
    prepared = _waiting(db_session_factory, RolloutStatus.PREPARED)
    built = _waiting(db_session_factory, RolloutStatus.BUILT)
    other = _waiting(db_session_factory, RolloutStatus.PREPARED, node="y")
    keeper = WaitingLeaseKeeper(
        db_session_factory, "x", [RolloutStatus.PREPARED, RolloutStatus.BUILT], 30
    )
    assert keeper.stamp_once() == 2
    _sweep(db_session_factory, timedelta(0))  # the stamp is fresh: the node is alive
    assert _row(db_session_factory, prepared) == (RolloutStatus.PREPARED, 1)
    sent.clear()
    _sweep(db_session_factory)  # the node stopped stamping
    assert _row(db_session_factory, prepared) == (RolloutStatus.QUEUED, 2)
    assert _row(db_session_factory, built) == (RolloutStatus.QUEUED, 2)
    assert {(m.stage, m.attempt, m.node) for m in sent} == {(Stage.PREPARE, 2, None)}
    assert _row(db_session_factory, other) == (RolloutStatus.PREPARED, 1), "never stamped"


def test_a_stranded_rollout_given_up_runs_its_jobs_early_stop_check(
    db_session_factory: sessionmaker[Session],
    sent: list[StageMessage],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The give-up path reads the row's task index for the early-stop check: a stranded row
    selected without it failed that check silently (logged, never applied)."""
    spec = JobCreate.model_validate(
        {
            "tasks": [{"instruction": "x"}],
            "samples_per_task": 2,
            "retries": {"max_attempts": 1},
            "stop": {"usable_samples_per_group": 1},
        }
    )
    with unit_of_work(db_session_factory) as session:
        rid = create_job(session, spec, "p").rollout_ids[0]
        session.execute(
            update(Rollout)
            .where(Rollout.id == rid)
            .values(status=RolloutStatus.PREPARED, node="x", lease_expires_at=utcnow())
        )
    with caplog.at_level("ERROR"):
        _sweep(db_session_factory)
    assert _row(db_session_factory, rid)[0] == RolloutStatus.FAILED
    assert not [r for r in caplog.records if "early-stop check" in r.getMessage()]
