"""The in-cluster path: enqueue_job writes PostgreSQL and publishes, without HTTP."""

from __future__ import annotations

import threading
import time

import pytest
from api_support import RecordingPublisher, row_counts
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.dispatch.submit import Enqueuer, IdempotencyConflict, enqueue_job, submit_job
from polar_mq.jobs.schemas import JobCreate
from polar_mq.lifecycle.stages import Stage
from tests.conftest import module_database

pg_url, pg_engine = module_database("polar_mq_enqueue")  # it counts every row

SPEC = {"tasks": [{"instruction": "a"}, {"instruction": "b"}], "samples_per_task": 2}


def test_enqueue_job_from_a_dict(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    sent = RecordingPublisher(db_session_factory)
    job = enqueue_job(settings, SPEC, publisher=sent)
    assert job.created and len(job.rollout_ids) == 4
    assert [m.rollout_id for m in sent.messages] == job.rollout_ids
    assert {(m.stage, m.pool) for m in sent.messages} == {(Stage.PREPARE, "cpu")}
    assert sent.unseen_at_publish == []
    assert row_counts(db_session_factory)["rollouts"] == 4


def test_a_bad_spec_raises_and_creates_nothing(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    sent = RecordingPublisher(db_session_factory)
    with pytest.raises(ValidationError):
        enqueue_job(settings, {"tasks": [{"no": "instruction"}]}, publisher=sent)
    assert sent.messages == []
    assert row_counts(db_session_factory)["jobs"] == 0


def test_idempotent_resubmission_and_conflict(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    sent = RecordingPublisher(db_session_factory)
    with Enqueuer(settings, publisher=sent) as enqueuer:
        first = enqueuer.enqueue(JobCreate.model_validate({**SPEC, "idempotency_key": "x"}))
        again = enqueuer.enqueue({**SPEC, "idempotency_key": "x"})
        assert (again.job_id, again.created) == (first.job_id, False)
        with pytest.raises(IdempotencyConflict):
            enqueuer.enqueue({**SPEC, "samples_per_task": 1, "idempotency_key": "x"})
    assert len(sent.messages) == 4


def test_a_submission_racing_on_the_same_key_gets_the_winners_job(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    sent = RecordingPublisher(db_session_factory)
    spec = JobCreate.model_validate({**SPEC, "idempotency_key": "race"})
    results: list[object] = []
    with Enqueuer(settings, publisher=sent) as enqueuer:
        winner_session = enqueuer.session_factory()
        winner = submit_job(winner_session, spec, "cpu")  # inserted, not yet committed
        loser = threading.Thread(target=lambda: results.append(enqueuer.enqueue(spec)))
        loser.start()
        time.sleep(0.5)  # the loser's INSERT now waits on the winner's uncommitted key
        winner_session.commit()
        winner_session.close()
        loser.join(10)
    (lost,) = results
    assert getattr(lost, "job_id", None) == winner.job_id
    assert getattr(lost, "created", None) is False
    assert row_counts(db_session_factory)["jobs"] == 1
    assert len(sent.messages) == 4
