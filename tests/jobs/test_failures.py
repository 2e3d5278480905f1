"""A job's failures on real PostgreSQL (`jobs.failures`): the errors of every attempt in the status,
and the platform stop: N attempts in a row failing the same way on the platform's side, with no
rollout served, fail the rest of the job at once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.failures import PLATFORM_STOP_AFTER, stop_on_platform_failures
from polar_mq.jobs.queries import job_status
from polar_mq.jobs.read_models import ErrorCount
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.jobs.verdicts import MODEL_NOT_SERVED
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.models import Event, EventKind, Rollout, RolloutStatus
from polar_mq.models.base import utcnow

NOT_SERVED = MODEL_NOT_SERVED
ENGINE_DOWN = "no engine answers the proxy at http://127.0.0.1:9 (0 of 1 engines usable)"
RESTARTED = "the proxy restarted while the agent ran (calls it made then were refused)"


@pytest.fixture()
def factory(db_session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    def publish(_messages: Sequence[StageMessage]) -> None:
        pass

    attach_publisher(db_session_factory, publish)
    return db_session_factory


def _job(factory: sessionmaker[Session], rollouts: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    spec = JobCreate.model_validate(
        {"tasks": [{"instruction": "say hi"}], "samples_per_task": rollouts}
    )
    with unit_of_work(factory) as session:
        job_id = create_job(session, spec, "cpu").job_id
    with factory() as session:
        ids = list(session.scalars(select(Rollout.id).where(Rollout.job_id == job_id)).all())
    return job_id, ids


def _attempt_failed(
    factory: sessionmaker[Session], job_id: uuid.UUID, rollout_id: uuid.UUID, why: str,
    reason: str = "backend_error", kind: str = EventKind.REQUEUED,
) -> None:  # fmt: skip
    """An attempt's failure event, as `lifecycle.recovery.restart` writes it (the why last)."""
    with unit_of_work(factory) as session:
        session.add(
            Event(
                job_id=job_id,
                rollout_id=rollout_id,
                stage="run_agent",
                kind=kind,
                attempt=1,
                worker="w",
                at=utcnow(),
                detail={"reason": reason, "error": f"agent exited 1\nstderr tail\n{why}"},
            )
        )


def _stop(factory: sessionmaker[Session], job_id: uuid.UUID) -> int:
    with unit_of_work(factory) as session:
        return stop_on_platform_failures(session, job_id, "w")


def _statuses(factory: sessionmaker[Session], job_id: uuid.UUID) -> list[str]:
    with factory() as session:
        return sorted(session.scalars(select(Rollout.status).where(Rollout.job_id == job_id)))


def test_status_counts_the_errors_of_retried_attempts(factory: sessionmaker[Session]) -> None:
    job_id, ids = _job(factory, 3)
    for rollout_id in ids:
        _attempt_failed(factory, job_id, rollout_id, NOT_SERVED)
    _attempt_failed(factory, job_id, ids[0], RESTARTED)
    with factory() as session:
        status = job_status(session, job_id)
    assert status.state == "running"  # every rollout is retrying: nothing ended yet
    assert status.errors == [
        ErrorCount("backend_error", NOT_SERVED, 3),
        ErrorCount("backend_error", RESTARTED, 1),
    ]


@pytest.mark.parametrize("why", [ENGINE_DOWN, NOT_SERVED])
def test_the_same_engine_failure_in_a_row_fails_the_rest_of_the_job(
    factory: sessionmaker[Session], why: str
) -> None:
    job_id, ids = _job(factory, 8)
    for rollout_id in ids[: PLATFORM_STOP_AFTER - 1]:
        _attempt_failed(factory, job_id, rollout_id, why)
    assert _stop(factory, job_id) == 0  # one failure short
    _attempt_failed(factory, job_id, ids[PLATFORM_STOP_AFTER - 1], why)
    assert _stop(factory, job_id) == 8
    assert _statuses(factory, job_id) == [RolloutStatus.FAILED] * 8
    with factory() as session:
        status = job_status(session, job_id)
        errors = session.scalars(select(Rollout.error).where(Rollout.job_id == job_id)).all()
    assert status.state == "failed"
    assert set(errors) == {
        f"job stopped early: its last {PLATFORM_STOP_AFTER} attempts failed the same way on the "
        f"platform's side and no rollout got an answer through: {why}"
    }
    assert _stop(factory, job_id) == 0  # nothing left to stop


@pytest.mark.parametrize("case", ["mixed", "agent_error", "served", "transient"])
def test_no_stop_when_the_failures_differ_or_the_engine_served(
    factory: sessionmaker[Session], case: str
) -> None:
    job_id, ids = _job(factory, 8)
    for i, rollout_id in enumerate(ids[:PLATFORM_STOP_AFTER]):
        why = NOT_SERVED if case == "mixed" and i == 0 else ENGINE_DOWN
        if case == "transient":  # the same failure every time, but one a retry gets past
            why = RESTARTED
        reason = "runtime_error" if case == "agent_error" and i == 0 else "backend_error"
        _attempt_failed(factory, job_id, rollout_id, why, reason=reason)
    if case == "served":  # one rollout ended its agent: the engine works
        with unit_of_work(factory) as session:
            session.execute(
                update(Rollout).where(Rollout.id == ids[-1]).values(
                    status=RolloutStatus.COMPLETED, termination_reason="completed", reward=0.0
                )
            )  # fmt: skip
    assert _stop(factory, job_id) == 0
    assert RolloutStatus.FAILED not in _statuses(factory, job_id)
