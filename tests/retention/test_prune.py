"""Prune: whole days dropped, the boundary day and the default partition trimmed, the calls of
running jobs and undelivered groups kept, an export written before anything is deleted."""

from __future__ import annotations

import gzip
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.infra.migrate import upgrade
from polar_mq.models import GroupDelivery
from polar_mq.retention import partitions
from polar_mq.retention.prune import prune
from tests.retention.conftest import NOW, call_row, days_ago, insert_calls, make_job

CUTOFF = partitions.day_start(days_ago(30)) + timedelta(hours=12)


def ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.scalars(text("SELECT id FROM llm_calls")))


def names(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {p.name for p in partitions.list_partitions(conn)}


def scenario(engine: Engine) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """Calls spread over past days; returns (ids prune must delete, ids it must keep)."""
    with engine.begin() as conn:
        for day in (days_ago(40), days_ago(39), CUTOFF):
            partitions.create_day(conn, day)
    done = make_job(engine, ["completed", "failed"])
    running = make_job(engine, ["completed", "running"])
    leased = make_job(engine, ["completed", "completed"])
    with unit_of_work(make_session_factory(engine)) as session:
        for index, acked in ((0, NOW), (1, None)):  # task 1 handed out, never acknowledged
            session.add(
                GroupDelivery(
                    job_id=leased_job(engine, leased[0]), task_index=index, consumer="t",
                    leased_at=NOW, lease_expires_at=NOW, acked_at=acked,
                )
            )  # fmt: skip
    go = [
        call_row(done[0], 0, days_ago(40)),
        call_row(leased[0], 0, days_ago(40)),
        call_row(done[1], 0, days_ago(39)),
        call_row(done[0], 1, days_ago(35)),  # no partition that day: the default one
        call_row(done[0], 2, CUTOFF - timedelta(hours=1)),
    ]
    stay = [
        call_row(running[0], 0, days_ago(40)),
        call_row(leased[1], 0, days_ago(40)),
        call_row(running[1], 1, days_ago(35)),
        call_row(done[0], 3, CUTOFF + timedelta(hours=1)),
        call_row(done[1], 1, NOW),
    ]
    insert_calls(engine, go + stay)
    return {r["id"] for r in go}, {r["id"] for r in stay}


def leased_job(engine: Engine, rollout_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.scalar(text("SELECT job_id FROM rollouts WHERE id = :i"), {"i": rollout_id})


def test_prune_drops_old_days_trims_boundary_keeps_protected(
    engine: Engine, tmp_path: Path
) -> None:
    go, stay = scenario(engine)
    old_days = {partitions.day_name(partitions.day_start(days_ago(d))) for d in (40, 39)}
    assert old_days <= names(engine)

    report = prune(engine, CUTOFF, export_dir=tmp_path / "export")

    assert ids(engine) == stay
    assert not old_days & names(engine)
    assert set(report.partitions_dropped) == old_days
    assert (report.rows_deleted, report.rows_kept, report.rows_exported) == (5, 3, 5)
    assert report.bytes_before is not None and report.bytes_after is not None
    exported = []
    for name in report.files:
        with gzip.open(name, "rt") as f:
            exported += [json.loads(line) for line in f]
    assert {uuid.UUID(r["id"]) for r in exported} == go
    first = next(r for r in exported if uuid.UUID(r["id"]) in go)
    assert first["prompt_ids"] == [1, 2, 3] and first["logprobs"] == [-0.5, -0.25]
    assert first["request"] == {"messages": [{"role": "user", "content": "hi"}]}
    assert first["job_id"] is not None
    assert not list((tmp_path / "export").glob(".*partial"))

    again = prune(engine, CUTOFF)  # nothing left to delete; protected calls still kept
    assert (again.rows_deleted, again.rows_kept) == (0, 3)
    assert ids(engine) == stay


def test_dry_run_counts_and_deletes_nothing(engine: Engine, tmp_path: Path) -> None:
    go, stay = scenario(engine)
    before = names(engine)
    report = prune(engine, CUTOFF, export_dir=tmp_path, dry_run=True)
    assert (report.rows_deleted, report.rows_kept) == (5, 3)
    assert report.partitions_dropped == [] and report.files == []
    assert ids(engine) == go | stay
    assert names(engine) == before
    assert list(tmp_path.iterdir()) == []


def test_failed_export_deletes_nothing(engine: Engine, tmp_path: Path) -> None:
    go, stay = scenario(engine)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(OSError):
        prune(engine, CUTOFF, export_dir=blocker / "export")
    assert ids(engine) == go | stay


def test_prune_without_partitions_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'calls.db'}"
    upgrade(url)
    engine = create_db_engine(url)
    try:
        (done,) = make_job(engine, ["completed"])
        (running,) = make_job(engine, ["running"])
        old, kept, new = (
            call_row(done, 0, days_ago(40)),
            call_row(running, 0, days_ago(40)),
            call_row(done, 1, NOW),
        )
        insert_calls(engine, [old, kept, new])
        report = prune(engine, CUTOFF, export_dir=tmp_path / "x")
        assert (report.rows_deleted, report.rows_kept, report.rows_exported) == (1, 1, 1)
        with engine.connect() as conn:
            left = {uuid.UUID(hex=v) for v in conn.scalars(text("SELECT id FROM llm_calls"))}
        assert left == {kept["id"], new["id"]}
    finally:
        engine.dispose()
