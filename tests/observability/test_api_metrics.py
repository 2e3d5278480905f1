"""The API's `/metrics`: requests by route template, rollouts and jobs counted in PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.ui.app import create_app
from tests.observability.scrape import Samples, value


@pytest.fixture()
def client(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    settings = Settings(database_url=pg_url, metrics_cache_s=0)

    def publish(messages: Sequence[StageMessage]) -> None:
        return None

    app = create_app(settings, session_factory=db_session_factory, publisher=publish)
    with TestClient(app) as test_client:
        yield test_client


def _scrape(client: TestClient) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def test_requests_are_counted_by_route_template(client: TestClient) -> None:
    for _ in range(2):
        assert client.get(f"/v1/jobs/{uuid.uuid4()}").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    assert client.get("/ui/static/ui.css").status_code == 200
    samples = _scrape(client)
    assert value(samples, "polar_api_requests_total", route="/v1/jobs/{job_id}", status="404") == 2
    assert value(samples, "polar_api_requests_total", route="(unmatched)") == 1
    assert value(samples, "polar_api_requests_total", route="/ui/static/*", status="200") == 1
    assert not any(
        "/v1/jobs/" in dict(labels).get("route", "") and "{" not in dict(labels)["route"]
        for labels in samples["polar_api_requests_total"]
    )  # never a concrete id as a label
    count = "polar_api_request_duration_seconds_count"
    assert value(samples, count, route="/v1/jobs/{job_id}") == 2


def test_rollouts_and_jobs_by_state_follow_the_database(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    assert value(_scrape(client), "polar_rollouts") == 0
    tasks = [{"instruction": f"task {i}", "answer": str(i)} for i in range(2)]
    answer = client.post("/v1/jobs", json={"tasks": tasks, "samples_per_task": 3})
    assert answer.status_code == 201, answer.text
    samples = _scrape(client)
    assert value(samples, "polar_rollouts", status="queued") == 6
    assert value(samples, "polar_jobs", state="running") == 1
    assert value(samples, "polar_api_db_up") == 1
    with db_session_factory.begin() as session:
        session.execute(update(Rollout).values(status=RolloutStatus.COMPLETED))
    samples = _scrape(client)
    assert value(samples, "polar_rollouts", status="completed") == 6
    assert value(samples, "polar_rollouts", status="queued") == 0
    assert value(samples, "polar_jobs", state="completed") == 1
    assert value(samples, "polar_jobs", state="running") == 0


def test_metrics_is_not_in_the_openapi_schema(client: TestClient) -> None:
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]


def test_the_submitted_line_names_its_job(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="polar_mq"):
        response = client.post("/v1/jobs", json={"tasks": [{"instruction": "hi"}]})
    assert response.status_code == 201, response.text
    lines = [r for r in caplog.records if "submitted by" in r.getMessage()]
    assert [getattr(r, "job_id", None) for r in lines] == [response.json()["job_id"]]
