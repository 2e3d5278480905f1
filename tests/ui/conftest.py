"""Dashboard fixtures: the API app (with /ui) on the session's PostgreSQL, keys of two tenants."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.tenants.keys import create_api_key
from polar_mq.ui.app import create_app
from tests.api.api_support import REDIS_URL, RecordingPublisher


@dataclass(frozen=True)
class Keys:
    alice_read: str
    alice_write: str
    bob_read: str
    bob_write: str
    alice_policy_only: str


@pytest.fixture()
def settings(pg_url: str) -> Settings:
    return Settings.model_validate(
        {
            "database_url": pg_url,
            "broker_url": f"{REDIS_URL}/0",
            "pool": "cpu",
            # the system page lists only this deployment's workers: none share this prefix
            "queue_prefix": f"uitest{uuid.uuid4().hex[:8]}",
            # nothing listens here: token text comes from the stored responses only
            "upstream_url": "http://127.0.0.1:9",
        }
    )


@pytest.fixture()
def keys(db_session_factory: sessionmaker[Session]) -> Keys:
    with unit_of_work(db_session_factory) as session:

        def key(name: str, tenant: str, scopes: str) -> str:
            return create_api_key(session, name, tenant=tenant, scopes=scopes)

        return Keys(
            alice_read=key("alice-dash", "alice", "jobs:read"),
            alice_write=key("alice-trainer", "alice", "jobs:read,jobs:write"),
            bob_read=key("bob-dash", "bob", "jobs:read"),
            bob_write=key("bob-trainer", "bob", "jobs:read,jobs:write"),
            alice_policy_only=key("alice-policy", "alice", "policy:write"),
        )


@pytest.fixture()
def app(settings: Settings, db_session_factory: sessionmaker[Session]) -> FastAPI:
    publisher = RecordingPublisher(db_session_factory)
    return create_app(settings, session_factory=db_session_factory, publisher=publisher)


@pytest.fixture()
def client(app: FastAPI, keys: Keys) -> Iterator[TestClient]:
    with TestClient(app, follow_redirects=False) as test_client:
        yield test_client
