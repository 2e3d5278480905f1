"""`polar_jobs{state}` counts jobs by the same rule as the status API.

The gauge computes each job's state in SQL (`jobs.job_state.job_states_by_count`, one pass for a
scrape) while the status endpoints use `job_state` in Python; before, the gauge knew only
running / completed / cancelled / stopped, so a failed job was counted `completed`. Jobs in every
state are made the way the workers end rollouts, on the session's real PostgreSQL, and the gauge's
counts must equal the Python rule applied to every job of the database.
"""

from __future__ import annotations

import uuid
from collections import Counter

from api_support import complete_rollout, fail_rollout, rollout_ids, set_status
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.jobs.job_state import RolloutCounts, job_state
from polar_mq.jobs.queries import job_counts
from polar_mq.models import Job, RolloutStatus
from polar_mq.observability.api_metrics import count_states


def _job(client: TestClient, factory: sessionmaker[Session]) -> list[uuid.UUID]:
    tasks = [{"instruction": f"task {i}", "answer": str(i)} for i in range(2)]
    answer = client.post("/v1/jobs", json={"tasks": tasks, "samples_per_task": 1})
    assert answer.status_code == 201, answer.text
    return [rid for group in rollout_ids(factory, answer.json()["job_id"]) for rid in group]


def _python_states(factory: sessionmaker[Session]) -> Counter[str]:
    with factory() as session:
        jobs = session.scalars(select(Job)).all()
        counts = job_counts(session, [job.id for job in jobs])
        return Counter(job_state(job, counts.get(job.id, RolloutCounts())) for job in jobs)


def test_the_gauge_counts_every_state_as_the_status_api_does(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    factory = db_session_factory
    a, b = _job(client, factory)  # completed
    complete_rollout(factory, a, reward=1.0)
    complete_rollout(factory, b, reward=0.0)
    a, b = _job(client, factory)  # completed_with_failures
    complete_rollout(factory, a, reward=1.0)
    fail_rollout(factory, b, reason="backend_error")
    a, b = _job(client, factory)  # failed
    fail_rollout(factory, a, reason="backend_error")
    fail_rollout(factory, b, reason="runtime_error")
    a, b = _job(client, factory)  # running: one still under way
    complete_rollout(factory, a, reward=1.0)
    set_status(factory, b, RolloutStatus.RUNNING)
    a, b = _job(client, factory)  # every rollout cancelled: the job reads cancelled
    set_status(factory, a, RolloutStatus.CANCELLED)
    set_status(factory, b, RolloutStatus.CANCELLED)

    expected = _python_states(factory)
    assert {"completed", "completed_with_failures", "failed", "running", "cancelled"} <= set(
        expected
    )
    with factory() as session:
        gauge = count_states(session).jobs
    assert {state: n for state, n in gauge.items() if n} == dict(expected)
