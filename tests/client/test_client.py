"""Client and AsyncClient against the API served over a real socket (uvicorn in a thread)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import AsyncClient, Client, PolarMQError
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.jobs import results
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.models import LlmCall, Rollout, RolloutStatus, TrajectorySample
from polar_mq.models.base import utcnow
from tests.live_api import serve_api

TASKS = [{"instruction": f"task {i}"} for i in range(5)]


@pytest.fixture()
def published() -> list[StageMessage]:
    return []


@pytest.fixture()
def base_url(
    pg_url: str, db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> Iterator[str]:
    with serve_api(pg_url, db_session_factory, published) as url:
        yield url


@pytest.fixture()
def client(base_url: str) -> Iterator[Client]:
    with Client(base_url, timeout=10) as c:
        yield c


def _finish(
    factory: sessionmaker[Session], job_id: str, *, task_index: int | None = None,
    reward: float = 1.0, age_s: float = 0.0,
) -> None:  # fmt: skip
    """Mark rollouts (of one group, or all) completed, as the evaluate stage would."""
    query = update(Rollout).where(Rollout.job_id == uuid.UUID(job_id))
    if task_index is not None:
        query = query.where(Rollout.task_index == task_index)
    with unit_of_work(factory) as session:
        session.execute(
            query.values(
                status=RolloutStatus.COMPLETED,
                termination_reason="completed",
                reward=reward,
                finished_at=utcnow() - timedelta(seconds=age_s),
                n_llm_calls=1,
            )
        )


def _finish_later(factory: sessionmaker[Session], job_id: str, n_groups: int) -> threading.Thread:
    def run() -> None:
        for task_index in range(n_groups):
            time.sleep(0.15)
            _finish(factory, job_id, task_index=task_index, reward=task_index / 10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_submit_status_and_wait_with_progress(
    client: Client, db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    job = client.submit(TASKS, samples_per_task=2, metadata={"step": 7})
    assert job.created and len(job.rollout_ids) == 10
    assert [str(m.rollout_id) for m in published] == job.rollout_ids
    status = client.status(job.job_id)
    assert status["state"] == "running" and status["metadata"] == {"step": 7}
    assert status["stages"]["prepare"]["queued"] == 10

    worker = _finish_later(db_session_factory, job.job_id, len(TASKS))
    final = client.wait(job.job_id, progress=True, poll_s=0.05, timeout=20)
    worker.join()
    assert final["state"] == "completed" and final["terminal"] == 10
    assert final["mean_reward"] == pytest.approx(0.2)
    assert client.jobs()["jobs"][0]["job_id"] == job.job_id


def test_submit_is_idempotent_with_a_key(client: Client) -> None:
    first = client.submit(TASKS[:1], idempotency_key="same")
    again = client.submit(TASKS[:1], idempotency_key="same")
    assert (again.job_id, again.created) == (first.job_id, False)
    fresh = client.submit(TASKS[:1])  # no key given: the client makes a fresh one
    assert fresh.created and fresh.job_id != first.job_id


def test_wait_times_out(client: Client) -> None:
    job = client.submit(TASKS[:1])
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.wait(job.job_id, progress=False, poll_s=0.05, timeout=0.3)
    assert time.monotonic() - started < 5


def test_results_pages_through_every_group(
    client: Client, db_session_factory: sessionmaker[Session]
) -> None:
    job = client.submit(TASKS, samples_per_task=2)
    order = [3, 1, 4, 0, 2]
    for rank, task_index in enumerate(order):
        _finish(db_session_factory, job.job_id, task_index=task_index, age_s=50 - 10 * rank)
    groups = client.results(job.job_id, page_size=2)
    assert [g["task_index"] for g in groups] == order  # in completion order
    assert all(g["complete"] and len(g["samples"]) == 2 for g in groups)
    by_task = client.results(job.job_id, complete_only=False, page_size=3)
    assert [g["task_index"] for g in by_task] == [0, 1, 2, 3, 4]


def test_iter_groups_yields_each_group_once_as_it_completes(
    client: Client, db_session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "RESULTS_SETTLE_S", 0.05)
    job = client.submit(TASKS, samples_per_task=2)
    worker = _finish_later(db_session_factory, job.job_id, len(TASKS))
    seen = [
        g["task_index"]
        for g in client.iter_groups(job.job_id, poll_s=0.05, timeout=20, page_size=2)
    ]
    worker.join()
    assert sorted(seen) == list(range(len(TASKS)))
    assert seen == sorted(seen)  # in completion order


def test_rollout_trajectory_and_calls(
    client: Client, db_session_factory: sessionmaker[Session]
) -> None:
    job = client.submit(TASKS[:1])
    rid = uuid.UUID(job.rollout_ids[0])
    with unit_of_work(db_session_factory) as session:
        session.add(
            LlmCall(
                id=uuid.uuid4(),
                rollout_id=rid,
                seq=0,
                backend="b",
                model="m",
                api_type="chat",
                status_code=200,
                request={},
                response={},
                prompt_ids=[5, 6],
                completion_ids=[9],
                logprobs=[-1.0],
                latency_ms=1.0,
            )
        )
        session.add(
            TrajectorySample(
                rollout_id=rid,
                sample_index=0,
                builder="per_call",
                prompt_ids=[5, 6],
                response_ids=[9],
                loss_mask=[1],
                logprobs=[-1.0],
            )
        )
    assert client.rollout(job.rollout_ids[0])["status"] == "queued"
    assert client.trajectory(job.rollout_ids[0])["samples"][0]["response_ids"] == [9]
    (call,) = client.calls(job.rollout_ids[0])
    assert call["prompt_ids"] == [5, 6] and call["logprobs"] == [-1.0]


def test_errors_raise_polarmqerror(client: Client, base_url: str) -> None:
    with pytest.raises(PolarMQError) as bad:
        client.submit([{"answer": "no instruction"}])
    assert bad.value.status == 422 and bad.value.type == "validation_error"
    assert "tasks.0" in bad.value.message
    with pytest.raises(PolarMQError) as missing:
        client.status(str(uuid.uuid4()))
    assert (missing.value.status, missing.value.type) == (404, "not_found")
    with pytest.raises(PolarMQError) as too_big:
        client.submit([{"instruction": "x" * 100_000}])
    assert (too_big.value.status, too_big.value.type) == (413, "payload_too_large")
    nowhere = Client(f"http://127.0.0.1:{free_port()}", timeout=2)
    with nowhere, pytest.raises(PolarMQError) as down:
        nowhere.status(str(uuid.uuid4()))
    assert down.value.status == 0 and down.value.transient


def test_api_key_is_sent_as_bearer(
    base_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    from polar_mq.api.auth import create_api_key

    with unit_of_work(db_session_factory) as session:
        key = create_api_key(session, "trainer", tenant="t", scopes="jobs:write,jobs:read")
    with Client(base_url, api_key="pmq_wrong") as wrong, pytest.raises(PolarMQError) as refused:
        wrong.jobs()
    assert (refused.value.status, refused.value.type) == (401, "unauthorized")
    with Client(base_url, api_key=key) as right:
        assert right.submit(TASKS[:1]).created


def test_async_client(base_url: str, db_session_factory: sessionmaker[Session]) -> None:
    async def scenario() -> None:
        async with AsyncClient(base_url, timeout=10) as client:
            job = await client.submit(TASKS[:2], samples_per_task=2)
            assert (await client.status(job.job_id))["total"] == 4
            worker = _finish_later(db_session_factory, job.job_id, 2)
            final = await client.wait(job.job_id, poll_s=0.05, timeout=20)
            worker.join()
            assert final["state"] == "completed"
            groups = await client.results(job.job_id, include_trajectories=True, page_size=1)
            assert [g["task_index"] for g in groups] == [0, 1]
            assert groups[0]["samples"][0]["trajectories"] == []
            streamed = [g["task_index"] async for g in client.iter_groups(job.job_id)]
            assert streamed == [0, 1]
            trajectory = await client.trajectory(job.rollout_ids[0])
            assert trajectory["samples"] == []
            with pytest.raises(PolarMQError):
                await client.rollout(str(uuid.uuid4()))

    asyncio.run(scenario())
