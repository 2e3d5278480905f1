"""API fixtures: the app on the session's PostgreSQL with an in-memory publisher.

The publisher records every stage message and, at the moment it is called, checks from a separate
connection that the rollouts they name are already committed: that is the enqueue-after-commit
guarantee seen from a worker's side.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_support import REDIS_URL, RecordingPublisher
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.ui.app import create_app


@pytest.fixture()
def settings(pg_url: str) -> Settings:
    return Settings.model_validate(
        {
            "database_url": pg_url,
            "broker_url": f"{REDIS_URL}/0",
            "max_body_bytes": 64 * 1024,
            "pool": "cpu",
        }
    )


@pytest.fixture()
def publisher(db_session_factory: sessionmaker[Session]) -> RecordingPublisher:
    return RecordingPublisher(db_session_factory)


@pytest.fixture()
def app(
    settings: Settings, db_session_factory: sessionmaker[Session], publisher: RecordingPublisher
) -> FastAPI:
    return create_app(settings, session_factory=db_session_factory, publisher=publisher)


@pytest.fixture()
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client
