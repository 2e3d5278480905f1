"""Truthful job states over HTTP: completed, completed_with_failures, failed, cancelled.

Before, every job whose rollouts had all ended read `completed` (a green full bar on the
dashboard), a job with 31 failures or one fully cancelled included, and `cancelled_at` stayed
null after `POST /v1/jobs/{id}/cancel`. Rollout progress is written the way the workers write it
(`api_support`), on the session's real PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any

from api_support import complete_rollout, fail_rollout, rollout_ids, set_status
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import RolloutStatus


def _submit(client: TestClient, n_tasks: int = 2, samples: int = 2) -> str:
    tasks = [{"instruction": f"task {i}", "answer": str(i)} for i in range(n_tasks)]
    answer = client.post("/v1/jobs", json={"tasks": tasks, "samples_per_task": samples})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["job_id"])


def _status(client: TestClient, job_id: str) -> dict[str, Any]:
    answer = client.get(f"/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _listed_state(client: TestClient, job_id: str) -> str:
    jobs = client.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
    return str(next(j["state"] for j in jobs if j["job_id"] == job_id))


def _results_state(client: TestClient, job_id: str) -> str:
    return str(client.get(f"/v1/jobs/{job_id}/results").json()["job_state"])


def _all(factory: sessionmaker[Session], job_id: str) -> list[uuid.UUID]:
    return [rid for group in rollout_ids(factory, job_id) for rid in group]


def _assert_state(client: TestClient, job_id: str, state: str) -> dict[str, Any]:
    status = _status(client, job_id)
    assert status["state"] == state, status
    assert _listed_state(client, job_id) == state
    assert _results_state(client, job_id) == state
    return status


def test_some_rollouts_failed_is_completed_with_failures(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    clean = _submit(client)
    for rid in _all(db_session_factory, clean):
        complete_rollout(db_session_factory, rid, reward=1.0)
    status = _assert_state(client, clean, "completed")
    assert status["finished_at"] is not None and status["cancelled_at"] is None

    job_id = _submit(client)
    first, *rest = _all(db_session_factory, job_id)
    fail_rollout(db_session_factory, first, reason="backend_error")
    for rid in rest:
        complete_rollout(db_session_factory, rid, reward=0.5)
    status = _assert_state(client, job_id, "completed_with_failures")
    assert status["by_status"] == {"completed": 3, "failed": 1}
    assert status["cancelled_at"] is None


def test_every_rollout_failed_is_failed_once_the_last_one_ended(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=1)
    first, second = _all(db_session_factory, job_id)
    fail_rollout(db_session_factory, first, reason="backend_error")
    set_status(db_session_factory, second, RolloutStatus.RUNNING)
    assert _assert_state(client, job_id, "running")["stages"]["run_agent"]["running"] == 1

    fail_rollout(db_session_factory, second, reason="backend_error")
    status = _assert_state(client, job_id, "failed")
    assert status["n_scored"] == 0 and status["finished_at"] is not None


def test_cancelling_a_running_job_stamps_cancelled_at_and_the_state(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client)
    first, second, *_ = _all(db_session_factory, job_id)
    complete_rollout(db_session_factory, first, reward=1.0)
    set_status(db_session_factory, second, RolloutStatus.RUNNING)

    answer = client.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 200, answer.text
    status = _assert_state(client, job_id, "cancelled")
    assert status["cancelled_at"] is not None
    assert status["by_status"] == {"completed": 1, "cancelled": 3}
    assert all(slots == {"queued": 0, "running": 0} for slots in status["stages"].values())

    again = client.post(f"/v1/jobs/{job_id}/cancel")  # safe to repeat: the first stamp stays
    assert again.json()["cancelled"] == []
    assert _status(client, job_id)["cancelled_at"] == status["cancelled_at"]

    ended = _submit(client, n_tasks=1)  # cancelling a job that already ended changes nothing
    for rid in _all(db_session_factory, ended):
        complete_rollout(db_session_factory, rid, reward=1.0)
    assert client.post(f"/v1/jobs/{ended}/cancel").json()["already_terminal"] == 2
    assert _assert_state(client, ended, "completed")["cancelled_at"] is None


def test_every_rollout_cancelled_one_by_one_is_cancelled(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=1)
    for rid in _all(db_session_factory, job_id):
        assert client.post(f"/v1/rollouts/{rid}/cancel").status_code == 200
    status = _assert_state(client, job_id, "cancelled")
    assert status["cancelled_at"] is None  # the job itself was not cancelled


def test_the_openapi_schema_lists_the_job_states(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    states = {
        "running", "completed", "completed_with_failures", "failed", "cancelled", "stopped",
    }  # fmt: skip
    assert set(schemas["JobStatus"]["properties"]["state"]["enum"]) == states
    assert set(schemas["JobSummary"]["properties"]["state"]["enum"]) == states
    assert set(schemas["ResultsPage"]["properties"]["job_state"]["enum"]) == states
