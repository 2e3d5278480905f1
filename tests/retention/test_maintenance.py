"""The automatic side: maintenance prunes when a retention is set, and reads by rollout still
find every call of the rollout across day partitions (they are bounded to its days)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, text, update

from polar_mq.config import Settings
from polar_mq.infra.db import make_session_factory, unit_of_work
from polar_mq.models import Rollout
from polar_mq.retention import partitions
from polar_mq.retention.maintenance import maintain
from polar_mq.rollouts.queries import rollout_calls
from tests.retention.conftest import NOW, call_row, days_ago, insert_calls, make_job


def test_maintenance_prunes_and_exports_with_a_retention_set(
    engine: Engine, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        partitions.create_day(conn, days_ago(20))
    (done,) = make_job(engine, ["completed"])
    (running,) = make_job(engine, ["queued"])
    insert_calls(
        engine,
        [call_row(done, 0, days_ago(20)), call_row(running, 0, days_ago(20)),
         call_row(done, 1, NOW)],
    )  # fmt: skip
    settings = Settings(call_retention_days=10, call_export_dir=tmp_path)
    report = maintain(engine, settings, now=NOW)
    assert report is not None
    assert (report.rows_deleted, report.rows_kept, report.rows_exported) == (1, 1, 1)
    assert report.partitions_dropped == [partitions.day_name(partitions.day_start(days_ago(20)))]
    assert [Path(f).parent for f in report.files] == [tmp_path]
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM llm_calls")) == 2


def test_rollout_calls_span_day_partitions(engine: Engine) -> None:
    (rollout,) = make_job(engine, ["completed"])
    created, finished = days_ago(5), days_ago(3)
    with unit_of_work(make_session_factory(engine)) as session:
        session.execute(
            update(Rollout)
            .where(Rollout.id == rollout)
            .values(created_at=created, finished_at=finished)
        )
    with engine.begin() as conn:
        for day in range(3, 6):
            partitions.create_day(conn, days_ago(day))
    rows = [
        call_row(rollout, i, at)
        for i, at in enumerate([created + timedelta(minutes=1), days_ago(4), finished])
    ]
    insert_calls(engine, rows)
    with make_session_factory(engine)() as session:
        calls = rollout_calls(session, rollout).calls
    assert [c.seq for c in calls] == [0, 1, 2]


def test_one_maintenance_round_at_a_time(engine: Engine) -> None:
    from polar_mq.retention.maintenance import LOCK_KEY

    (done,) = make_job(engine, ["completed"])
    insert_calls(engine, [call_row(done, 0, days_ago(20))])
    settings = Settings(call_retention_days=10)
    with engine.connect() as other:  # another sweeper's round in progress
        assert other.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY})
        assert maintain(engine, settings, now=NOW) is None
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
    report = maintain(engine, settings, now=NOW)
    assert report is not None and report.rows_deleted == 1
