"""The stage runner around a stage function: claim, run, record, hand over, and what it does
when the stage raises or fails. The build stage is replaced by a scripted one (no runtime)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
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
from polar_mq.lifecycle.transitions import Claimed
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.trajectories.base import BuildResult
from polar_mq.workers import runner
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.run_result import RunResult
from polar_mq.workers.stages.common import StageFailure
from polar_mq.workers.stages.outcomes import Built, StageOutcome
from polar_mq.workers.sweeper import Sweeper

BuildStage = Callable[[WorkerContext, Claimed], StageOutcome]


def _built(_ctx: WorkerContext, claimed: Claimed) -> Built:
    """A scripted build: no calls, no samples."""
    return Built(claimed.rollout, "per_call", 0, BuildResult([], {"samples": 1}))


@pytest.fixture()
def sent() -> list[StageMessage]:
    return []


@pytest.fixture()
def ctx(pg_url: str, sent: list[StageMessage]) -> Iterator[WorkerContext]:
    def publish(messages: Sequence[StageMessage]) -> None:
        sent.extend(messages)

    context = WorkerContext(Settings(database_url=pg_url, retry_backoff_s=1.0), publish)
    yield context
    context.session_factory.kw["bind"].dispose()


def _ran_rollout(factory: sessionmaker[Session]) -> uuid.UUID:
    """A rollout waiting for build (its agent ran), in a job with one in-place retry."""
    spec = JobCreate.model_validate(
        {"tasks": [{"instruction": "x"}], "priority": 4, "retries": {"stage_retries": 1}}
    )
    attach_publisher(factory, lambda _: None)
    with unit_of_work(factory) as session:
        rid = create_job(session, spec, "p").rollout_ids[0]
        session.execute(
            update(Rollout).where(Rollout.id == rid).values(status=RolloutStatus.RAN, node="n1")
        )
    return rid


def _status(factory: sessionmaker[Session], rid: uuid.UUID) -> str:
    with factory() as session:
        return str(session.get_one(Rollout, rid).status)


def _build_with(monkeypatch: pytest.MonkeyPatch, stage: BuildStage) -> None:
    monkeypatch.setitem(runner.STAGE_FUNCTIONS, Stage.BUILD, stage)


def test_a_stage_that_succeeds_records_and_hands_over(
    ctx: WorkerContext,
    sent: list[StageMessage],
    db_session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rid = _ran_rollout(db_session_factory)
    _build_with(monkeypatch, _built)
    assert runner.run_stage(ctx, Stage.BUILD, str(rid), "t1", attempt=1) == RunResult.done()
    assert _status(db_session_factory, rid) == RolloutStatus.BUILT
    assert sent == [StageMessage(Stage.EVALUATE, rid, "p", "n1", attempt=1, priority=4)]
    # the same message delivered twice: the claim fails, nothing runs, nothing is sent
    again = runner.run_stage(ctx, Stage.BUILD, str(rid), "t2", attempt=1)
    assert again == RunResult.skipped("built")
    assert len(sent) == 1


def test_a_raising_stage_is_retried_in_place_then_failed(
    ctx: WorkerContext,
    sent: list[StageMessage],
    db_session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rid = _ran_rollout(db_session_factory)

    def broken(_ctx: WorkerContext, _claimed: Claimed) -> StageOutcome:
        raise RuntimeError("database hiccup")

    _build_with(monkeypatch, broken)
    assert runner.run_stage(ctx, Stage.BUILD, str(rid), "t1", attempt=1) == RunResult.retry(1)
    assert _status(db_session_factory, rid) == RolloutStatus.RAN
    (again,) = sent
    assert (again.stage, again.retries, again.countdown, again.priority) == (
        Stage.BUILD, 1, 1.0, 4,
    )  # fmt: skip
    outcome = runner.run_stage(ctx, Stage.BUILD, str(rid), "t2", attempt=1, retries=1)
    assert outcome == RunResult.failed("runtime_error")
    assert _status(db_session_factory, rid) == RolloutStatus.FAILED


def test_a_stage_failure_ends_the_rollout_with_its_reason(
    ctx: WorkerContext, db_session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = _ran_rollout(db_session_factory)

    def refused(_ctx: WorkerContext, _claimed: Claimed) -> StageOutcome:
        raise StageFailure("builder_error", "no calls to build from")

    _build_with(monkeypatch, refused)
    assert runner.run_stage(ctx, Stage.BUILD, str(rid), "t1") == RunResult.failed("builder_error")
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert (row.status, row.termination_reason) == (RolloutStatus.FAILED, "builder_error")
        assert row.reward is None and row.lease_owner is None


def test_a_message_of_an_earlier_attempt_is_a_no_op(
    ctx: WorkerContext, db_session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = _ran_rollout(db_session_factory)
    _build_with(monkeypatch, lambda _ctx, _claimed: pytest.fail("must not run"))
    stale = runner.run_stage(ctx, Stage.BUILD, str(rid), "t1", attempt=7)
    assert stale == RunResult.skipped("stale_attempt")
    assert _status(db_session_factory, rid) == RolloutStatus.RAN


def test_a_dropped_connection_is_retried_then_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """`OperationalError` is retried (3 attempts in all, short backoff); other errors are not."""
    from sqlalchemy.exc import OperationalError

    monkeypatch.setattr(runner.time, "sleep", lambda _s: None)
    calls: list[str] = []

    @runner._retry_db
    def flaky(fail_times: int, error: Exception) -> str:
        calls.append("x")
        if len(calls) <= fail_times:
            raise error
        return "ok"

    dropped = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    assert flaky(2, dropped) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(OperationalError):
        flaky(3, dropped)
    assert len(calls) == runner.DB_ATTEMPTS
    calls.clear()
    with pytest.raises(ValueError):
        flaky(1, ValueError("not the database"))
    assert len(calls) == 1


def test_a_stage_failure_after_the_rollout_was_cancelled_is_reported_as_lease_lost(
    ctx: WorkerContext, db_session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job was cancelled while the stage ran and the stage then failed before the lease
    keeper noticed: the fenced commit refuses the failure, and the runner says so (Flower showed
    `failed:...` for a rollout that ended cancelled)."""
    rid = _ran_rollout(db_session_factory)

    def cancelled_meanwhile(_ctx: WorkerContext, _claimed: Claimed) -> StageOutcome:
        with unit_of_work(db_session_factory) as session:
            session.execute(
                update(Rollout)
                .where(Rollout.id == rid)
                .values(status=RolloutStatus.CANCELLED, lease_owner=None)
            )
        raise StageFailure("builder_error", "no calls to build from")

    _build_with(monkeypatch, cancelled_meanwhile)
    assert runner.run_stage(ctx, Stage.BUILD, str(rid), "t1") == RunResult.lease_lost()
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert (row.status, row.termination_reason) == (RolloutStatus.CANCELLED, None)


def test_a_rollout_left_waiting_for_its_node_carries_a_lease_a_dead_node_lets_expire(
    ctx: WorkerContext,
    db_session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built, the rollout waits in its node's evaluate queue with a lease of `lease_s` that no
    keeper renews here (its node died before the first renewal): the sweeper starts it over once
    that lease expires. Before, it left build with no lease at all and waited forever."""
    rid = _ran_rollout(db_session_factory)
    _build_with(monkeypatch, _built)
    before = utcnow()
    assert runner.run_stage(ctx, Stage.BUILD, str(rid), "t1", attempt=1) == RunResult.done()
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert (row.status, row.lease_owner) == (RolloutStatus.BUILT, None)
        assert row.lease_expires_at is not None
        lease = (row.lease_expires_at - before).total_seconds()
    assert ctx.settings.lease_s - 5 <= lease <= ctx.settings.lease_s + 5
    sweeper = Sweeper(Settings(database_url=ctx.settings.database_url), db_session_factory,
                      lambda _queue: 1, name="sweeper-test")  # fmt: skip
    sweeper.sweep_once(utcnow())  # the lease is fresh: its node may still be alive
    assert _status(db_session_factory, rid) == RolloutStatus.BUILT
    sweeper.sweep_once(utcnow() + timedelta(seconds=ctx.settings.lease_s + 1))
    with db_session_factory() as session:
        row = session.get_one(Rollout, rid)
        assert (row.status, row.attempt) == (RolloutStatus.QUEUED, 2)
