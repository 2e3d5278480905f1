"""Compare-and-set transitions: one winner per stage, fenced results, failures recorded."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import make_session_factory, unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.fused import MAX_FUSED_ROWS
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import (
    Claimed,
    LeaseLost,
    claim,
    fail,
    finish,
    finish_in_one,
    renew_lease,
    renew_leases,
)
from polar_mq.models import Event, Rollout, RolloutStatus, TrajectorySample
from polar_mq.models.base import utcnow
from polar_mq.workers.stages.outcomes import SAMPLES


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


def _claimed_build(factory: sessionmaker[Session], owner: str = "w1") -> Claimed:
    rid = _one_rollout(factory)
    with unit_of_work(factory) as session:
        session.execute(update(Rollout).where(Rollout.id == rid).values(status=RolloutStatus.RAN))
    with unit_of_work(factory) as session:
        won = claim(session, Stage.BUILD, rid, owner, 60)
    assert isinstance(won, Claimed)
    return won


def _sample(claimed: Claimed, index: int, messages: Any = None) -> dict[str, Any]:
    return {
        "rollout_id": claimed.rollout.id,
        "attempt": claimed.rollout.attempt,
        "sample_index": index,
        "builder": "per_call",
        "prompt_ids": [1, 2, index],
        "response_ids": [3],
        "loss_mask": [1],
        "logprobs": None,  # a NULL: typed by its column, not taken for text
        "messages": messages,
        "metadata": {"i": index},
        "created_at": utcnow(),
    }


def test_a_finish_with_rows_is_one_statement_fenced_by_owner(
    db_session_factory: sessionmaker[Session],
) -> None:
    """`finish_in_one` (the worker's finish, in autocommit): the rows come with the update and
    its event, and a fenced-out finish leaves none of the three."""
    engine = db_session_factory.kw["bind"]
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    won = _claimed_build(db_session_factory)
    rid = won.rollout.id
    impostor = Claimed(won.rollout, won.spec, won.instance, "w2", Stage.BUILD)
    rows = {SAMPLES: [_sample(won, 0, [{"role": "user"}]), _sample(won, 1)]}
    with pytest.raises(LeaseLost), auto.connect() as conn:
        finish_in_one(conn, impostor, {"n_llm_calls": 9}, rows, {"x": 1})
    with db_session_factory() as session:
        assert session.scalars(select(TrajectorySample).where(_of(rid))).all() == []
    with auto.connect() as conn:
        assert finish_in_one(conn, won, {"n_llm_calls": 2}, rows, {"samples": 2})
    with db_session_factory() as session:
        rollout = session.get_one(Rollout, rid)
        assert (rollout.status, rollout.n_llm_calls, rollout.lease_owner) == ("built", 2, None)
        samples = session.scalars(
            select(TrajectorySample).where(_of(rid)).order_by(TrajectorySample.sample_index)
        ).all()
        assert [(s.prompt_ids, s.logprobs, s.messages, s.meta) for s in samples] == [
            ([1, 2, 0], None, [{"role": "user"}], {"i": 0}),
            ([1, 2, 1], None, None, {"i": 1}),
        ]
        finished = select(Event.detail).where(Event.rollout_id == rid, Event.kind == "finished")
        assert list(session.scalars(finished)) == [{"samples": 2}]


def test_a_finish_that_does_not_fit_one_statement_does_nothing(
    db_session_factory: sessionmaker[Session],
) -> None:
    """Too many rows, or a row leaving out a column with a Python default: False, nothing done
    (the runner then finishes in a transaction)."""
    engine = db_session_factory.kw["bind"]
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    won = _claimed_build(db_session_factory)
    many = {SAMPLES: [_sample(won, i) for i in range(MAX_FUSED_ROWS + 1)]}
    no_default = dict(_sample(won, 0))
    del no_default["metadata"]
    with auto.connect() as conn:
        assert not finish_in_one(conn, won, {}, many, {})
        assert not finish_in_one(conn, won, {}, {SAMPLES: [no_default]}, {})
    with db_session_factory() as session:
        assert session.get_one(Rollout, won.rollout.id).status == RolloutStatus.BUILDING
    with unit_of_work(db_session_factory) as session:  # the transaction takes them all
        finish(session, won, {}, many, {}, None)
    with db_session_factory() as session:
        count = session.scalar(select(func.count()).where(_of(won.rollout.id)))
        assert count == MAX_FUSED_ROWS + 1


def _of(rid: uuid.UUID) -> Any:
    return TrajectorySample.rollout_id == rid


def test_the_batch_renewal_fences_each_lease_as_the_single_one(
    db_session_factory: sessionmaker[Session],
) -> None:
    """`renew_leases` (one statement) extends exactly the leases `renew_lease` would: the right
    rollout, still in the busy state, leased by the owner; not another owner's, another state's,
    nor a rollout that does not exist."""
    with unit_of_work(db_session_factory) as session:
        spec = {"tasks": [{"instruction": f"t{i}"} for i in range(3)]}
        rids = create_job(session, JobCreate.model_validate(spec), "p").rollout_ids
    for i, rid in enumerate(rids):
        with unit_of_work(db_session_factory) as session:
            assert isinstance(claim(session, Stage.PREPARE, rid, f"w{i}", 60), Claimed)
    busy = RolloutStatus.PREPARING
    holds = [
        (rids[0], busy, "w0"),
        (rids[1], busy, "someone else"),
        (rids[2], RolloutStatus.RUNNING, "w2"),
        (uuid.uuid4(), busy, "w0"),
    ]
    expires = utcnow() + timedelta(hours=1)
    with db_session_factory() as session:  # what the single renewals would extend, undone
        single = {hold for hold in holds if renew_lease(session, *hold, expires)}
        session.rollback()
    with unit_of_work(db_session_factory) as session:
        batch = renew_leases(session, holds, expires)
    assert batch == single == {holds[0]}
    with db_session_factory() as session:
        rows = session.execute(select(Rollout.id, Rollout.lease_expires_at).where(_in(rids)))
        extended = {rid for rid, at in rows if at == expires}
    assert extended == {rids[0]}


def _in(rids: list[uuid.UUID]) -> Any:
    return Rollout.id.in_(rids)
