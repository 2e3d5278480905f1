"""`stop` over HTTP: unreachable rules are 4xx JSON, and a stopped job says what the stop did."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from api_support import complete_rollout, rollout_ids
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.early_stop import after_rollout_ended
from polar_mq.models import Job
from polar_mq.spec import load_spec

TASKS = [{"instruction": "a"}, {"instruction": "b"}, {"instruction": "c"}]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ({"usable_samples_per_group": 3}, "exceeds samples_per_task (2)"),
        ({"groups": 4}, "exceeds the number of tasks (3)"),
        ({}, "needs usable_samples_per_group, groups, or both"),
        ({"groups": 1, "stragglers": "later"}, "stop.stragglers"),
    ],
)
def test_unreachable_stop_rules_are_422_json(
    client: TestClient, stop: dict[str, Any], expected: str
) -> None:
    body = {"tasks": TASKS, "samples_per_task": 2, "stop": stop}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error" and expected in error["message"]


def test_a_stopped_job_reports_how_many_groups_were_stopped_early(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    body = {"tasks": TASKS, "samples_per_task": 2, "stop": {"groups": 1}}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["job_id"]
    before = client.get(f"/v1/jobs/{job_id}").json()
    assert before["state"] == "running"
    assert before["stop"] == {
        "usable_samples_per_group": None, "groups": 1, "stragglers": "cancel", "stopped": False,
        "stopped_at": None, "groups_complete_at_stop": None, "groups_stopped": None,
        "rollouts_cancelled": None,
    }  # fmt: skip

    (a, b), _, _ = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a)
    complete_rollout(db_session_factory, b)
    with unit_of_work(db_session_factory) as session:
        spec = load_spec(session.get_one(Job, uuid.UUID(job_id)).spec)
        after_rollout_ended(session, uuid.UUID(job_id), 0, spec, "test")

    status = client.get(f"/v1/jobs/{job_id}").json()
    assert status["state"] == "stopped"
    stop = status["stop"]
    assert stop["stopped"] and stop["stopped_at"]
    assert (stop["groups_complete_at_stop"], stop["groups_stopped"]) == (1, 2)
    assert stop["rollouts_cancelled"] == 4
    assert status["by_status"] == {"completed": 2, "cancelled": 4}
    listed = client.get("/v1/jobs").json()["jobs"]
    assert [j["state"] for j in listed if j["job_id"] == job_id] == ["stopped"]
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert "StopStatus" in schema and "stopped" in schema["StopStatus"]["properties"]
