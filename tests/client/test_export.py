"""Export a real job (submitted through the API and service layer, progress written to PostgreSQL
as the stage workers write it) to JSONL and Parquet; `datasets` loads both and the token arrays
equal the stored ones exactly."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import AsyncClient, Client, PolarMQError, export
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.group_stats import GRPO_EPS
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.models import Rollout, RolloutStatus, TrajectorySample
from polar_mq.models.base import utcnow
from tests.live_api import serve_api

TASKS = [{"instruction": f"task {i}", "answer": str(i), "metadata": {"i": i}} for i in range(3)]
MAX_TOKEN = 2**31 - 1


@pytest.fixture()
def client(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[Client]:
    published: list[StageMessage] = []
    with serve_api(pg_url, db_session_factory, published) as url, Client(url, timeout=10) as c:
        yield c


def _finish(
    factory: sessionmaker[Session], rollout_id: str, rng: random.Random, reward: float | None,
    reason: str = "completed",
) -> None:  # fmt: skip
    """Write a rollout's training samples and outcome as the build and evaluate stages do."""
    rid = uuid.UUID(rollout_id)
    with unit_of_work(factory) as session:
        if reason == "completed":
            for index in range(rng.randint(1, 3)):
                n = rng.randint(1, 40)
                with_logprobs = rng.random() < 0.7
                session.add(
                    TrajectorySample(
                        rollout_id=rid, attempt=1, sample_index=index, builder="per_call",
                        prompt_ids=[rng.randint(0, MAX_TOKEN) for _ in range(rng.randint(1, 60))],
                        response_ids=[MAX_TOKEN, 0, *(rng.randint(0, 50_000) for _ in range(n))],
                        loss_mask=[rng.randint(0, 1) for _ in range(n + 2)],
                        logprobs=[-rng.expovariate(1.0) for _ in range(n + 2)]
                        if with_logprobs else None,
                        meta={"policy_versions": [index + 1, 1], "finish_reason": "stop"},
                    )
                )  # fmt: skip
        session.execute(
            update(Rollout)
            .where(Rollout.id == rid)
            .values(
                status=RolloutStatus.COMPLETED if reason == "completed" else RolloutStatus.FAILED,
                termination_reason=reason, reward=reward, finished_at=utcnow(),
            )
        )  # fmt: skip


def _make_job(client: Client, factory: sessionmaker[Session]) -> tuple[str, list[str]]:
    job = client.submit(TASKS, samples_per_task=3)
    rng = random.Random(7)
    for i, rid in enumerate(job.rollout_ids):
        if i == 4:
            _finish(factory, rid, rng, reward=None, reason="runtime_error")
        else:
            _finish(factory, rid, rng, reward=float(i % 2))
    return job.job_id, job.rollout_ids


def _stored(factory: sessionmaker[Session], job_id: str) -> dict[tuple[str, int], Any]:
    with factory() as session:
        rows = session.scalars(
            select(TrajectorySample)
            .join(Rollout, Rollout.id == TrajectorySample.rollout_id)
            .where(Rollout.job_id == uuid.UUID(job_id))
        ).all()
        return {(str(r.rollout_id), r.sample_index): r for r in rows}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_loads_with_datasets_and_round_trips_tokens(
    client: Client, db_session_factory: sessionmaker[Session], tmp_path: Path, fmt: str
) -> None:
    import datasets  # with pandas, loaded only here: every xdist worker collects this file

    job_id, rollout_ids = _make_job(client, db_session_factory)
    path = tmp_path / f"out.{fmt}"
    summary = client.export(job_id, path, advantages="grpo", page_size=1)
    assert (summary.format, summary.groups, summary.job_finished) == (fmt, 3, True)
    stored = _stored(db_session_factory, job_id)
    assert summary.rows == len(stored) > 6

    loaded = datasets.load_dataset("json" if fmt == "jsonl" else "parquet",
                                   data_files=str(path), split="train")  # fmt: skip
    assert loaded.num_rows == len(stored)
    seen = set()
    for row in loaded:
        piece = stored[(row["rollout_id"], row["trajectory_index"])]
        seen.add((row["rollout_id"], row["trajectory_index"]))
        assert row["prompt_ids"] == piece.prompt_ids
        assert row["response_ids"] == piece.response_ids
        assert row["loss_mask"] == piece.loss_mask
        assert row["logprobs"] == piece.logprobs  # float32 values, compared exactly
        assert row["job_id"] == job_id
        assert row["group_id"] == f"{job_id}:{row['task_index']}"
        assert row["policy_versions"] == sorted({1, row["trajectory_index"] + 1})
        assert row["policy_version_min"] == 1
        assert row["policy_version_max"] == max(row["policy_versions"])
        assert orjson.loads(row["task"]) == TASKS[row["task_index"]]
        assert orjson.loads(row["metadata"])["finish_reason"] == "stop"
        index = rollout_ids.index(row["rollout_id"])
        assert row["reward"] == float(index % 2) and row["usable"] is True
        assert row["group_incomplete"] is (row["task_index"] == 1)  # rollout 4 failed
    assert seen == set(stored)
    by_rollout = {r["rollout_id"]: r["advantage"] for r in loaded}
    # group 0 rewards [0, 1, 0]: mean 1/3, population std sqrt(2)/3
    std = (2**0.5) / 3
    assert by_rollout[rollout_ids[1]] == pytest.approx((1 - 1 / 3) / (std + GRPO_EPS))
    assert by_rollout[rollout_ids[0]] == pytest.approx((0 - 1 / 3) / (std + GRPO_EPS))
    # group 1: rollout 3 (reward 1) and 5 (reward 1) usable, 4 failed: equal rewards
    assert by_rollout[rollout_ids[3]] == 0.0 and rollout_ids[4] not in by_rollout


def test_parquet_is_written_in_row_groups_and_without_advantage_column(
    client: Client, db_session_factory: sessionmaker[Session], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    job_id, _ = _make_job(client, db_session_factory)
    monkeypatch.setattr(export, "PARQUET_TOKENS_PER_GROUP", 100)
    summary = client.export(job_id, tmp_path / "x.parquet", page_size=1)
    parquet = pq.ParquetFile(tmp_path / "x.parquet")
    assert parquet.metadata.num_rows == summary.rows
    assert parquet.metadata.num_row_groups > 1  # streamed, not buffered whole
    assert "advantage" not in parquet.schema_arrow.names
    assert parquet.schema_arrow.field("prompt_ids").type.value_type.bit_width == 32


def test_running_job_exports_complete_groups_only(
    client: Client, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    job = client.submit(TASKS, samples_per_task=2)
    rng = random.Random(3)
    for rid in job.rollout_ids[:2]:  # group 0 only
        _finish(db_session_factory, rid, rng, reward=1.0)
    with unit_of_work(db_session_factory) as session:  # completed long enough ago to be settled
        session.execute(
            update(Rollout)
            .where(Rollout.finished_at.is_not(None))
            .values(finished_at=utcnow() - timedelta(seconds=60))
        )
    summary = client.export(job.job_id, tmp_path / "r.jsonl")
    assert (summary.groups, summary.job_finished) == (1, False)
    rows = [orjson.loads(line) for line in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    assert {r["task_index"] for r in rows} == {0} and "advantage" not in rows[0]


def test_failed_export_leaves_no_partial_file(client: Client, tmp_path: Path) -> None:
    target = tmp_path / "keep.jsonl"
    target.write_text("earlier export\n")
    with pytest.raises(PolarMQError) as missing:
        client.export(str(uuid.uuid4()), target)
    assert missing.value.status == 404
    assert target.read_text() == "earlier export\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.jsonl"]
    with pytest.raises(ValueError, match="unknown export format 'csv'"):
        client.export(str(uuid.uuid4()), tmp_path / "x.csv", format="csv")


def test_async_client_export(
    client: Client, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    job_id, _ = _make_job(client, db_session_factory)
    base_url = str(client._http.base_url)

    async def run() -> export.ExportSummary:
        async with AsyncClient(base_url, timeout=10) as aclient:
            return await aclient.export(job_id, tmp_path / "a.parquet")

    summary = asyncio.run(run())
    assert summary.rows == len(_stored(db_session_factory, job_id))
    assert pq.read_table(tmp_path / "a.parquet").num_rows == summary.rows
