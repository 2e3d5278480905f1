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
from typing import Any, cast

import pytest
from alembic import command
from sqlalchemy import Column, Engine, MetaData, Table, inspect, select, text

from polar_mq.infra.db import create_db_engine
from polar_mq.infra.migrate import alembic_config, upgrade
from polar_mq.models import LlmCall
from polar_mq.proxy.store.call_insert import CallInserter
from tests.conftest import empty_database


@pytest.fixture(params=["postgresql", "sqlite"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    with empty_database("polar_mq_migration") as url:
        yield url


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


LATER_CALL_COLUMNS = ("prompt_source", "tito_fallback")
"""`llm_calls` columns added after 0009 (0011): not there when a test stands at 0008."""


def calls_0008() -> Table:
    """`llm_calls` as it stood at 0008, typed as the model types it."""
    own = cast(Table, LlmCall.__table__).columns
    kept = [c._copy() for c in own if c.name not in LATER_CALL_COLUMNS]
    return Table("llm_calls", MetaData(), *kept)


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


def test_group_deliveries_migration_and_claims(fresh_url: str) -> None:
    """0004 adds `group_deliveries`; the claim, redelivery and ack statements run on the migrated
    schema of both databases (SQLite is the embedded default), and the downgrade drops it."""
    import time

    from polar_mq.infra.db import make_session_factory, unit_of_work
    from polar_mq.jobs import deliveries
    from polar_mq.models import Job, JobTask, Rollout, RolloutStatus

    upgrade(fresh_url, "0003")
    engine = create_db_engine(fresh_url)
    try:
        assert "group_deliveries" not in inspect(engine).get_table_names()
        upgrade(fresh_url)
        engine.dispose()
        assert "group_deliveries" in inspect(engine).get_table_names()
        factory = make_session_factory(engine)
        job_id = uuid.uuid4()
        with unit_of_work(factory) as session:
            session.add(Job(id=job_id, samples_per_task=1, n_tasks=2, spec={}))
            session.flush()
            for index in range(2):
                task = JobTask(job_id=job_id, task_index=index, instance={"instruction": "x"})
                session.add(task)
                session.flush()
                session.add(
                    Rollout(
                        job_id=job_id, task_id=task.id, task_index=index, sample_index=0,
                        status=RolloutStatus.COMPLETED, termination_reason="completed",
                        reward=1.0, finished_at=datetime.now(UTC),
                    )
                )  # fmt: skip
        with unit_of_work(factory) as session:
            # long enough that "b" leases before it expires on a loaded machine
            first = deliveries.lease_groups(session, job_id, "a", 1, 1.5)
        with unit_of_work(factory) as session:
            second = deliveries.lease_groups(session, job_id, "b", 5, 30.0)
        assert [g.task_index for g in first.groups] == [0]
        assert [g.task_index for g in second.groups] == [1]
        time.sleep(1.6)
        with unit_of_work(factory) as session:
            again = deliveries.lease_groups(session, job_id, "b", 5, 30.0)
        (group,) = again.groups
        assert (group.task_index, group.delivery.delivery_count) == (0, 2)
        with unit_of_work(factory) as session:
            ids = [g.delivery.delivery_id for g in (*second.groups, group)]
            assert deliveries.ack_groups(session, job_id, "b", ids).acked == ids
        with unit_of_work(factory) as session:
            assert deliveries.lease_groups(session, job_id, "c", 5, 30.0).done is True

        command.downgrade(alembic_config(fresh_url), "0003")
        engine.dispose()
        assert "group_deliveries" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_partitioned_calls_upgrade_in_place_and_downgrade(fresh_url: str) -> None:
    """0009 partitions `llm_calls` by day on PostgreSQL keeping the rows already there (the old
    table becomes the legacy partition); new calls, of any date, go in through the proxy's
    inserter, a replay stays idempotent, and the downgrade copies every row back."""
    from datetime import timedelta

    from polar_mq.retention import partitions

    upgrade(fresh_url, "0008_tenants")
    engine = create_db_engine(fresh_url)
    try:
        rollout = uuid.uuid4()
        old = [call(rollout, i, created_at=datetime.now(UTC) - timedelta(days=i)) for i in (3, 1)]
        with engine.begin() as conn:  # the columns of 0008 (the inserter has later ones)
            conn.execute(calls_0008().insert(), old)
        upgrade(fresh_url)
        engine.dispose()
        new = [
            call(rollout, 5, created_at=datetime.now(UTC)),
            call(rollout, 6, created_at=datetime.now(UTC) + timedelta(days=60)),
        ]
        with engine.begin() as conn:
            CallInserter(engine).insert(conn, new + old)  # the old rows: a replay, no error
        with engine.connect() as conn:
            seqs = conn.scalars(text("SELECT seq FROM llm_calls ORDER BY seq")).all()
            assert seqs == [1, 3, 5, 6]
            if engine.dialect.name == "postgresql":
                names = [p.name for p in partitions.list_partitions(conn)]
                assert names[0] == "llm_calls_legacy" and names[-1] == partitions.DEFAULT
                where = conn.scalars(
                    text("SELECT tableoid::regclass::text FROM llm_calls ORDER BY seq")
                ).all()
                assert where[:2] == ["llm_calls_legacy"] * 2
                assert where[3] == partitions.DEFAULT

        command.downgrade(alembic_config(fresh_url), "0008_tenants")
        engine.dispose()
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                assert not partitions.is_partitioned(conn)
            assert conn.scalar(text("SELECT count(*) FROM llm_calls")) == 4
        with engine.begin() as conn:  # the plain table's key is the call id again
            conn.execute(calls_0008().insert(), [call(rollout, 7)])
        upgrade(fresh_url)
        engine.dispose()
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM llm_calls")) == 5
    finally:
        engine.dispose()
