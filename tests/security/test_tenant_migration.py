"""Migration 0008: keys and jobs made before tenants keep every access they had (admin tenant, all
scopes); idempotency keys become per tenant; downgrade and upgrade again work."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from polar_mq.api.auth import Authenticator
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.migrate import alembic_config, upgrade
from polar_mq.tenants.keys import hash_key
from tests.conftest import empty_database


@pytest.fixture(params=["postgresql", "sqlite"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tenants.db'}"
        return
    with empty_database("polar_mq_tenants") as url:
        yield url


def test_existing_keys_and_jobs_move_to_the_admin_tenant(fresh_url: str) -> None:
    upgrade(fresh_url, "0007_rollout_artifacts")
    engine = create_db_engine(fresh_url)
    now = datetime.now(UTC)
    job_id = uuid.uuid4()
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO api_keys (name, key_hash, created_at) VALUES ('old', :h, :t)"),
                {"h": hash_key("pmq_old"), "t": now},
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (id, idempotency_key, status, samples_per_task, n_tasks, "
                    "spec, metadata, created_at) VALUES (:id, 'k1', 'active', 1, 1, '{}', '{}', :t)"
                ),
                {"id": job_id.hex if fresh_url.startswith("sqlite") else job_id, "t": now},
            )
        upgrade(fresh_url)
        with engine.connect() as conn:
            key = conn.execute(text("SELECT tenant, scopes FROM api_keys")).one()
            assert tuple(key) == ("admin", "jobs:read,jobs:write,policy:write,admin")
            assert conn.execute(text("SELECT tenant FROM jobs")).scalar_one() == "admin"
        with make_session_factory(engine)() as session:
            principal = Authenticator().authenticate(session, "pmq_old")
        assert principal.tenant == "admin" and principal.is_admin
        assert principal.visible_tenant is None
        # the same idempotency key is now free for another tenant, still unique within one
        insert = text(
            "INSERT INTO jobs (id, tenant, idempotency_key, status, samples_per_task, n_tasks, "
            "spec, metadata, created_at) VALUES (:id, :tenant, 'k1', 'active', 1, 1, '{}', '{}', "
            ":t)"
        )
        other = uuid.uuid4()
        with engine.begin() as conn:
            ident = other.hex if fresh_url.startswith("sqlite") else other
            conn.execute(insert, {"id": ident, "tenant": "team-b", "t": now})
        with pytest.raises(IntegrityError), engine.begin() as conn:
            again = uuid.uuid4()
            ident = again.hex if fresh_url.startswith("sqlite") else again
            conn.execute(insert, {"id": ident, "tenant": "team-b", "t": now})
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs WHERE tenant = 'team-b'"))
        command.downgrade(alembic_config(fresh_url), "0007_rollout_artifacts")
        assert "tenant" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
        assert "scopes" not in {c["name"] for c in inspect(engine).get_columns("api_keys")}
        upgrade(fresh_url)
        assert "tenant" in {c["name"] for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
