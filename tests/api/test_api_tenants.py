"""Development mode (no keys): everything works as before tenants, as the `admin` tenant, and the
Settings quotas still bound what one request can create."""

from __future__ import annotations

import uuid

from api_support import RecordingPublisher, row_counts
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.models import Job
from polar_mq.ui.app import create_app

JOB = {"tasks": [{"instruction": "hi"}], "samples_per_task": 2}


def test_without_keys_every_route_is_open_as_admin(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    submitted = client.post("/v1/jobs", json=JOB)
    assert submitted.status_code == 201
    job_id = submitted.json()["job_id"]
    with db_session_factory() as session:
        assert session.scalar(select(Job.tenant).where(Job.id == uuid.UUID(job_id))) == "admin"
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert [j["job_id"] for j in client.get("/v1/jobs").json()["jobs"]] == [job_id]
    rollout = submitted.json()["rollout_ids"][0]
    assert client.get(f"/v1/rollouts/{rollout}").status_code == 200
    assert client.get("/v1/policy").status_code == 200
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_settings_quotas_apply_without_keys(
    settings: Settings, db_session_factory: sessionmaker[Session], publisher: RecordingPublisher
) -> None:
    limited = settings.model_copy(update={"quota_max_rollouts_per_request": 3})
    app = create_app(limited, session_factory=db_session_factory, publisher=publisher)
    with TestClient(app) as client:
        before = row_counts(db_session_factory)
        response = client.post("/v1/jobs", json={**JOB, "samples_per_task": 4})
        assert response.status_code == 422
        assert response.json()["error"]["type"] == "quota_exceeded"
        assert "max_rollouts_per_request = 3" in response.json()["error"]["message"]
        assert row_counts(db_session_factory) == before
        assert client.post("/v1/jobs", json={**JOB, "samples_per_task": 3}).status_code == 201
