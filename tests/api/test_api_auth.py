"""Bearer API keys: off while no key exists, required once one does; health stays open."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.api.auth import (
    Authenticator,
    create_api_key,
    has_active_keys,
    hash_key,
    revoke_api_key,
)
from polar_mq.infra.db import unit_of_work
from polar_mq.models import ApiKey
from polar_mq.tenants.scopes import ALL_SCOPES

JOB = {"tasks": [{"instruction": "hi"}]}


def _key(factory: sessionmaker[Session], name: str = "trainer") -> str:
    with unit_of_work(factory) as session:
        return create_api_key(session, name, tenant="admin", scopes=ALL_SCOPES)


def test_without_keys_auth_is_off(client: TestClient) -> None:
    assert client.get("/v1/jobs").status_code == 200
    assert client.post("/v1/jobs", json=JOB).status_code == 201


def test_only_the_hash_is_stored(db_session_factory: sessionmaker[Session]) -> None:
    key = _key(db_session_factory)
    assert key.startswith("pmq_") and len(key) > 40
    with db_session_factory() as session:
        stored = session.scalars(select(ApiKey.key_hash)).all()
        assert stored == [hash_key(key)] and key not in stored[0]
        assert has_active_keys(session)


def test_with_a_key_requests_need_it(
    app: FastAPI, db_session_factory: sessionmaker[Session]
) -> None:
    key = _key(db_session_factory)
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {key}"}):
            response = client.get("/v1/jobs", headers=headers)
            assert response.status_code == 401, headers
            assert response.json()["error"]["type"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
        rejected = client.post("/v1/jobs", json=JOB)
        assert rejected.status_code == 401
        # a stranger learns nothing about the schema: auth is checked before validation
        assert client.post("/v1/jobs", json={"tasks": []}).status_code == 401
        good = {"Authorization": f"Bearer {key}"}
        assert client.post("/v1/jobs", json=JOB, headers=good).status_code == 201
        assert client.get("/v1/jobs", headers=good).status_code == 200
        assert client.get("/healthz").status_code == 200  # probes need no key
        assert client.get("/openapi.json").status_code == 200


def test_a_revoked_key_is_refused_and_auth_stays_on(
    app: FastAPI, db_session_factory: sessionmaker[Session]
) -> None:
    key = _key(db_session_factory, "old")
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {key}"}
        assert client.get("/v1/jobs", headers=headers).status_code == 200
        with unit_of_work(db_session_factory) as session:
            assert revoke_api_key(session, "old") == 1
        assert client.get("/v1/jobs", headers=headers).status_code == 401
        # the table has no active key left, but revoking must never open the API
        assert client.get("/v1/jobs").status_code == 401


def test_the_any_keys_lookup_is_cached_briefly(db_session_factory: sessionmaker[Session]) -> None:
    now = [100.0]
    auth = Authenticator(ttl_s=5.0, clock=lambda: now[0])
    with db_session_factory() as session:
        assert auth.authenticate(session, None).name == "anonymous"
    key = _key(db_session_factory)
    with db_session_factory() as session:
        assert auth.authenticate(session, None).name == "anonymous"  # cached "no keys"
        now[0] += 5.1
        with pytest.raises(Exception) as refused:
            auth.authenticate(session, None)
        assert getattr(refused.value, "status", None) == 401
        principal = auth.authenticate(session, key)
        assert principal.name == "trainer" and principal.key_id is not None
