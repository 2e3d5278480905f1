"""Compare-and-set transitions: one winner per stage, fenced results, failures recorded."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.db import make_session_factory, unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, LeaseLost, claim, fail, finish
from polar_mq.models import Event, Rollout, RolloutStatus


def _one_rollout(factory: sessionmaker[Session]) -> uuid.UUID:
    with unit_of_work(factory) as session:
        job = create_job(session, JobCreate.model_validate({"tasks": [{"instruction": "x"}]}), "p")
    return job.rollout_ids[0]


def test_only_one_claim_wins(db_session_factory: sessionmaker[Session]) -> None:
    rid = _one_rollout(db_session_factory)
    with unit_of_work(db_session_factory) as session:
        first = claim(session, Stage.PREPARE, rid, "w1", 60)
    with unit_of_work(db_session_factory) as session:
        second = claim(session, Stage.PREPARE, rid, "w2", 60)
    assert isinstance(first, Claimed)
    assert second == RolloutStatus.PREPARING
    with unit_of_work(db_session_factory) as session:
        wrong_stage = claim(session, Stage.BUILD, rid, "w3", 60)
    assert wrong_stage == RolloutStatus.PREPARING


def test_finish_is_fenced_by_owner(db_session_factory: sessionmaker[Session]) -> None:
    rid = _one_rollout(db_session_factory)
    with unit_of_work(db_session_factory) as session:
        won = claim(session, Stage.PREPARE, rid, "w1", 60)
    assert isinstance(won, Claimed)
    impostor = Claimed(won.rollout, won.spec, won.instance, "w2", Stage.PREPARE)
    with pytest.raises(LeaseLost), unit_of_work(db_session_factory) as session:
        finish(session, impostor, {}, {}, {}, None)
    nxt = StageMessage(Stage.RUN_AGENT, rid, "p", "n1")
    with unit_of_work(db_session_factory) as session:
        finish(session, won, {"node": "n1"}, {}, {"ok": True}, nxt)
    with pytest.raises(LeaseLost), unit_of_work(db_session_factory) as session:
        finish(session, won, {}, {}, {}, None)  # a second finish of the same claim
    with db_session_factory() as session:
        rollout = session.get_one(Rollout, rid)
        assert (rollout.status, rollout.node, rollout.lease_owner) == ("prepared", "n1", None)
        assert rollout.started_at is not None
        kinds = session.scalars(select(Event.kind).where(Event.rollout_id == rid)).all()
        assert sorted(kinds) == ["finished", "started", "submitted"]


def test_fail_marks_terminal_without_reward(db_session_factory: sessionmaker[Session]) -> None:
    rid = _one_rollout(db_session_factory)
    with unit_of_work(db_session_factory) as session:
        won = claim(session, Stage.PREPARE, rid, "w1", 60)
    assert isinstance(won, Claimed)
    with unit_of_work(db_session_factory) as session:
        fail(session, won, "runtime_error", "disk full")
    with db_session_factory() as session:
        rollout = session.get_one(Rollout, rid)
        assert rollout.status == RolloutStatus.FAILED
        assert rollout.termination_reason == "runtime_error"
        assert rollout.reward is None and rollout.finished_at is not None


def test_in_autocommit_a_fenced_out_finish_writes_and_sends_nothing(
    db_session_factory: sessionmaker[Session],
) -> None:
    """The worker sends a claim and a row-less finish in autocommit (one fused statement each):
    a finish that lost its lease must leave neither an update nor an event nor a message."""
    engine = db_session_factory.kw["bind"]
    sent: list[StageMessage] = []
    auto = make_session_factory(engine.execution_options(isolation_level="AUTOCOMMIT"))
    attach_publisher(auto, sent.extend)
    rid = _one_rollout(db_session_factory)
    with unit_of_work(auto) as session:
        won = claim(session, Stage.PREPARE, rid, "w1", 60)
    assert isinstance(won, Claimed)
    impostor = Claimed(won.rollout, won.spec, won.instance, "w2", Stage.PREPARE)
    nxt = StageMessage(Stage.RUN_AGENT, rid, "p", "n1")
    with pytest.raises(LeaseLost), unit_of_work(auto) as session:
        finish(session, impostor, {"node": "bad"}, {}, {}, nxt)
    assert sent == []
    with unit_of_work(auto) as session:
        finish(session, won, {"node": "n1"}, {}, {"ok": True}, nxt)
    assert sent == [nxt]
    with db_session_factory() as session:
        rollout = session.get_one(Rollout, rid)
        assert (rollout.status, rollout.node, rollout.lease_owner) == ("prepared", "n1", None)
        events = session.execute(
            select(Event.kind, Event.worker, Event.detail).where(Event.rollout_id == rid)
        ).all()
        assert sorted((k, w) for k, w, _ in events) == [
            ("finished", "w1"),
            ("started", "w1"),
            ("submitted", None),
        ]
        assert [d for k, _, d in events if k == "finished"] == [{"ok": True}]
