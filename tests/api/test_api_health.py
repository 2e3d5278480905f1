"""Liveness, readiness against the real database and broker, and the default app wiring."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from api_support import REDIS_URL, row_counts
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.ui.app import create_app
from tests.conftest import module_database

pg_url, pg_engine = module_database("polar_mq_api_health")  # it counts every row

DEAD_PORT_URL = "redis://127.0.0.1:1/0"


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_the_root_sends_a_browser_to_the_dashboard(client: TestClient) -> None:
    """`GET /` was a 404: a newcomer opening the API's address saw nothing."""
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "/ui/"
    assert client.get("/").url.path.startswith("/ui/")  # the dashboard (or its sign-in)


def test_readyz_with_database_and_broker_up(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_is_503_when_the_broker_is_down(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    app = create_app(
        settings.model_copy(update={"broker_url": DEAD_PORT_URL}),
        session_factory=db_session_factory,
        publisher=lambda _messages: None,
    )
    with TestClient(app) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["error"]["type"] == "not_ready"
    assert body["error"]["message"].startswith("broker: unreachable")
    assert body["checks"]["database"] == "ok"


def test_readyz_is_503_when_the_database_is_down(settings: Settings) -> None:
    engine = create_db_engine("postgresql://postgres@127.0.0.1:1/none")
    app = create_app(
        settings, session_factory=make_session_factory(engine), publisher=lambda _m: None
    )
    with TestClient(app) as client:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["checks"]["database"].startswith("unreachable")
        assert response.json()["checks"]["broker"] == "ok"
        # and a request needing the database is a 503 JSON error, not a 500
        outage = client.get("/v1/jobs")
        assert outage.status_code == 503
        assert outage.json()["error"]["type"] == "unavailable"
    engine.dispose()


@pytest.fixture()
def redis_queue_prefix() -> Iterator[str]:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    yield prefix
    conn = redis.Redis.from_url(f"{REDIS_URL}/0")
    for key in conn.scan_iter(f"{prefix}.*"):
        conn.delete(key)
    conn.close()


def test_default_app_writes_postgres_and_publishes_to_redis(
    pg_url: str, db_session_factory: sessionmaker[Session], redis_queue_prefix: str
) -> None:
    settings = Settings.model_validate(
        {
            "database_url": pg_url,
            "broker_url": f"{REDIS_URL}/0",
            "pool": "cpu",
            "queue_prefix": redis_queue_prefix,
        }
    )
    with TestClient(create_app(settings)) as client:
        response = client.post(
            "/v1/jobs", json={"tasks": [{"instruction": "a"}], "samples_per_task": 3}
        )
        assert response.status_code == 201
        assert client.get("/readyz").status_code == 200
    assert row_counts(db_session_factory)["rollouts"] == 3
    conn = redis.Redis.from_url(f"{REDIS_URL}/0")
    try:
        # Default priority 0 is the lowest: kombu's list for step 9 (separator "\x06\x16").
        assert conn.llen(f"{redis_queue_prefix}.prepare.cpu\x06\x169") == 3
        assert conn.llen(f"{redis_queue_prefix}.prepare.cpu") == 0
    finally:
        conn.close()
