"""Strict job fields and hostile names: a 4xx in the API's error shape, never a 500 or a DB error.

- numbers and booleans are not coerced: `samples_per_task: "5"` or `true` is a 422;
- `prepare.files` keys outside the workspace (`..`, absolute) are refused at submit;
- a consumer name with a NUL (`?consumer=a%00b`) or other control character is a 422 on every
  group route, before it reaches PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.jobs.schemas import workspace_path_problem
from polar_mq.models import Job
from polar_mq.ui.app import create_app
from tests.conftest import module_database

TASKS = [{"instruction": "x"}]


pg_url, pg_engine = module_database("polar_mq_strict_fields")  # it counts every row


@pytest.fixture
def client(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    app = create_app(
        Settings(database_url=pg_url), session_factory=db_session_factory, publisher=lambda _: None
    )
    with TestClient(app) as test_client:
        yield test_client


def assert_422(response: Any, *fragments: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error" and error["message"], error
    for fragment in fragments:
        assert fragment in error["message"], error["message"]


def job_count(session_factory: sessionmaker[Session]) -> int:
    with session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("samples_per_task", "5"),
        ("samples_per_task", True),
        ("samples_per_task", 5.0),
        ("timeouts", {"agent_s": "60"}),
        ("timeouts", {"agent_s": True}),
        ("retries", {"max_attempts": "2"}),
        ("runtime", {"memory_mb": "512"}),
        ("runtime", {"warm": "true"}),
        ("stop", {"usable_samples_per_group": "1"}),
        ("staleness", {"max_staleness": True, "batch_size": 1}),
        ("priority", "3"),
    ],
)
def test_numbers_and_booleans_are_not_coerced(
    client: TestClient, db_session_factory: sessionmaker[Session], field: str, value: Any
) -> None:
    before = job_count(db_session_factory)  # a row another module's live server left stays out
    answer = client.post("/v1/jobs", json={"tasks": TASKS, field: value})
    assert_422(answer, field)
    assert job_count(db_session_factory) == before


def test_real_numbers_still_pass(client: TestClient) -> None:
    spec = {
        "tasks": TASKS,
        "samples_per_task": 2,
        "timeouts": {"agent_s": 60, "rollout_s": 90.5},  # an int is a fine float
        "runtime": {"memory_mb": 512, "warm": False},
    }
    assert client.post("/v1/jobs", json=spec).status_code == 201


@pytest.mark.parametrize(
    "path", ["../escape.txt", "a/../../b", "/etc/cron.d/job", "~/x", "", "a\x00b"]
)
def test_prepare_files_outside_the_workspace_are_refused_at_submit(
    client: TestClient, path: str
) -> None:
    for where in (
        {"prepare": {"files": {path: "x"}}},
        {"evaluation": {"prepare": {"files": {path: "x"}}}},
    ):
        answer = client.post("/v1/jobs", json={"tasks": TASKS, "runtime": where})
        assert_422(answer, "prepare.files")


def test_prepare_files_inside_the_workspace_pass() -> None:
    for path in ("a.txt", "tests/test_hidden.py", "./x", "a/..b/c", "..hidden"):
        assert workspace_path_problem(path) is None, path


@pytest.mark.parametrize("consumer", ["a\x00b", "tab\there", "bell\x07"])
def test_control_characters_in_a_consumer_are_a_4xx(client: TestClient, consumer: str) -> None:
    job = client.post("/v1/jobs", json={"tasks": TASKS}).json()["job_id"]
    stream = client.get(f"/v1/jobs/{job}/groups/stream", params={"consumer": consumer})
    assert_422(stream, "consumer")
    raw = client.get(f"/v1/jobs/{job}/groups/stream?consumer=a%00b")
    assert_422(raw, "consumer")
    body = {"consumer": consumer, "delivery_ids": []}
    for route, payload in (("lease", {"consumer": consumer}), ("ack", body), ("extend", body)):
        assert_422(client.post(f"/v1/jobs/{job}/groups/{route}", json=payload), "consumer")


@pytest.mark.parametrize(
    ("route", "payload"),
    [
        ("lease", {"consumer": "c", "max_groups": "5"}),
        ("lease", {"consumer": "c", "include_trajectories": "yes"}),
        ("lease", {"consumer": "c", "wait_s": True}),
        ("extend", {"consumer": "c", "delivery_ids": [], "lease_s": "60"}),
    ],
)
def test_group_bodies_are_strict(client: TestClient, route: str, payload: dict[str, Any]) -> None:
    job = client.post("/v1/jobs", json={"tasks": TASKS}).json()["job_id"]
    assert_422(client.post(f"/v1/jobs/{job}/groups/{route}", json=payload))
