"""Migration 0002 (`llm_calls.purpose`) on a fresh PostgreSQL database and on SQLite.

Each run migrates to 0001, writes a call the way the proxy did before purposes existed, upgrades
(the old call becomes an 'agent' call), writes a judge call through the proxy's batch inserter,
and checks that downgrading and upgrading again works.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Column, Engine, MetaData, Table, inspect, select, text

from polar_mq.db import create_db_engine
from polar_mq.migrate import alembic_config, upgrade
from polar_mq.models import LlmCall
from polar_mq.proxy.call_insert import CallInserter
from tests.conftest import PG_ADMIN_URL


@pytest.fixture(params=["postgresql", "sqlite"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    name = f"polar_mq_migration_{uuid.uuid4().hex[:10]}"
    admin = create_db_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def call(rollout_id: uuid.UUID, seq: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "rollout_id": rollout_id,
        "seq": seq,
        "backend": "b0",
        "model": "m",
        "api_type": "chat",
        "stream": False,
        "policy_version": 0,
        "status_code": 200,
        "complete": True,
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": None,
        "prompt_ids": None,
        "completion_ids": None,
        "logprobs": None,
        "finish_reason": "stop",
        "latency_ms": 1.0,
        "ttft_ms": None,
        "created_at": datetime.now(UTC),
        **extra,
    }


def columns(engine: Engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("llm_calls")}


def test_purpose_column_upgrade_and_downgrade(fresh_url: str) -> None:
    upgrade(fresh_url, "0001")
    engine = create_db_engine(fresh_url)
    try:
        assert "purpose" not in columns(engine)
        rollout = uuid.uuid4()
        old_columns = [c for c in LlmCall.__table__.columns if c.name != "purpose"]
        old_table = Table("llm_calls", MetaData(), *(Column(c.name, c.type) for c in old_columns))
        with engine.begin() as conn:
            conn.execute(old_table.insert(), call(rollout, 0))

        upgrade(fresh_url)
        engine.dispose()
        assert "purpose" in columns(engine)
        with engine.begin() as conn:
            CallInserter(engine).insert(conn, [call(rollout, 1, purpose="judge")])
        with engine.connect() as conn:
            rows = conn.execute(
                select(LlmCall.seq, LlmCall.purpose)
                .where(LlmCall.rollout_id == rollout)
                .order_by(LlmCall.seq)
            ).all()
        assert [tuple(r) for r in rows] == [(0, "agent"), (1, "judge")]

        command.downgrade(alembic_config(fresh_url), "0001")
        engine.dispose()
        assert "purpose" not in columns(engine)
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM llm_calls")) == 2
        upgrade(fresh_url)
        engine.dispose()
        with engine.connect() as conn:
            purposes = conn.scalars(text("SELECT purpose FROM llm_calls")).all()
        assert purposes == ["agent", "agent"]  # the downgrade forgot the judge mark, as it must
    finally:
        engine.dispose()
