"""Daily partitions of `llm_calls`: created by the migration and ahead by maintenance; an insert
at any date lands somewhere (the default partition catches what no day covers)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import Engine, text

from polar_mq.config import Settings
from polar_mq.retention import partitions
from polar_mq.retention.maintenance import maintain
from tests.retention.conftest import NOW, call_row, days_ago, insert_calls


def names(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [p.name for p in partitions.list_partitions(conn)]


def where(engine: Engine, call_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        return str(
            conn.scalar(
                text("SELECT tableoid::regclass::text FROM llm_calls WHERE id = :i"), {"i": call_id}
            )
        )


def test_migration_creates_today_a_week_ahead_and_default(engine: Engine) -> None:
    today = partitions.day_start(NOW)
    expected = [partitions.day_name(today + timedelta(days=d)) for d in range(8)]
    assert names(engine) == [*expected, partitions.DEFAULT]
    with engine.connect() as conn:
        assert partitions.is_partitioned(conn)


def test_inserts_at_any_date_land_in_their_day_or_the_default(engine: Engine) -> None:
    rollout = uuid.uuid4()
    today, old, far = (call_row(rollout, i, at) for i, at in enumerate(
        [NOW, days_ago(400), NOW + timedelta(days=90)]
    ))  # fmt: skip
    insert_calls(engine, [today, old, far])
    insert_calls(engine, [today, old, far])  # a replayed batch: idempotent on (id, created_at)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM llm_calls")) == 3
    assert where(engine, today["id"]) == partitions.day_name(partitions.day_start(NOW))
    assert where(engine, old["id"]) == partitions.DEFAULT
    assert where(engine, far["id"]) == partitions.DEFAULT


def test_maintenance_creates_days_ahead_moving_default_rows(engine: Engine) -> None:
    later = NOW + timedelta(days=10)
    stray = call_row(uuid.uuid4(), 0, later)
    insert_calls(engine, [stray])
    assert where(engine, stray["id"]) == partitions.DEFAULT
    settings = Settings(call_partitions_ahead_days=12)
    assert maintain(engine, settings, now=NOW) is None  # no retention set: partitions only
    day = partitions.day_name(partitions.day_start(later))
    assert day in names(engine)
    assert partitions.day_name(partitions.day_start(NOW + timedelta(days=12))) in names(engine)
    assert where(engine, stray["id"]) == day  # moved out of the default partition
    maintain(engine, settings, now=NOW)  # a second round has nothing to create
    assert len(names(engine)) == 13 + 1
