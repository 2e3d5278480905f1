"""An answered call is stored before the agent has its answer: a proxy killed with -9 right after
answering loses nothing (issue 37: the chaos soak's "calls seen = calls stored" failed once).

A real proxy process (`polar-mq proxy`, started by `polar_mq.stack.devstack`) in front of the fake
vLLM process logs to the session's PostgreSQL, with a long batching linger (1 s) so that a row
that waited for it would still be in memory when the kill lands. The agent makes one call
(JSON, then streamed); the moment its answer is complete the proxy's process group gets SIGKILL,
nothing drains. With the answer journal (the default) the row is in a journal file
(fdatasynced, or with `proxy_journal_sync="write"` in the kernel's page cache, which a kill of the
process spares), and the next proxy on that spill directory commits it; without it
(`proxy_answer_journal=False`) it is committed before the answer leaves. Before durable answers
the row sat in the writer's queue and died with the process.

The spill half (the database unreachable: the row is fsynced to the spill directory before the
answer leaves, and the next process replays it) is a unit of the writer, below, as are the
journal's own cases.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.models import LlmCall
from polar_mq.proxy.store.spill_records import read_segment
from polar_mq.proxy.store.writer import DbCallWriter
from polar_mq.stack.devstack import LocalStack

SECRET = "durable-secret-" + uuid.uuid4().hex
LINGER_S = 1.0
"""The writer's batching wait: far longer than the kill takes after the answer."""


@pytest.fixture()
def rollout_id(db_session_factory: sessionmaker[Session]) -> uuid.UUID:
    """A rollout of a new job (the proxy serves the calls of existing rollouts only)."""
    with unit_of_work(db_session_factory) as session:
        spec = {"tasks": [{"instruction": "x"}], "samples_per_task": 1}
        job = create_job(session, JobCreate.model_validate(spec), "p")
    return uuid.UUID(str(job.rollout_ids[0]))


def _stored(factory: sessionmaker[Session], rollout_id: uuid.UUID) -> list[LlmCall]:
    with factory() as session:
        return list(session.scalars(select(LlmCall).where(LlmCall.rollout_id == rollout_id)))


def _settings(pg_url: str, tmp_path: Path, upstream: int, mode: str) -> Settings:
    """`mode`: the journal with each sync kind ("fdatasync", "write"), or none ("commit")."""
    return Settings(
        database_url=pg_url,
        upstream_url=f"http://127.0.0.1:{upstream}",
        served_model="fake-model",
        proxy_port=free_port(),
        secret_key=SECRET,
        proxy_spill_dir=tmp_path / "spill",
        log_flush_interval_s=LINGER_S,
        proxy_answer_journal=mode != "commit",
        proxy_journal_sync="write" if mode == "write" else "fdatasync",
    )


def _answer_then_kill(
    settings: Settings, tmp_path: Path, rollout_id: uuid.UUID, body: dict[str, Any]
) -> bytes:
    """One agent call through a real proxy, SIGKILL of the proxy the moment the answer is in."""
    token = issue_rollout_token(SECRET, rollout_id, 600, attempt=1)
    with LocalStack(settings, tmp_path / "logs") as stack:
        stack.fake_upstream(int(str(settings.upstream_url).rsplit(":", 1)[1]))
        proxy = stack.proxy()
        with httpx.Client(
            base_url=settings.proxy_base_url,
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
            verify=client_ssl_context(),
        ) as agent:
            response = agent.post("/v1/chat/completions", json=body)
            proxy.stop(signal.SIGKILL)  # the whole process group, nothing drains
        assert response.status_code == 200, response.text
        assert not proxy.alive()
    return response.content


def _journaled_ids(spill: Path) -> list[str]:
    return [str(r["id"]) for s in sorted(spill.glob("**/*.seg")) for r in read_segment(s)[0]]


def _restart_proxy(settings: Settings, tmp_path: Path, stored: Callable[[], bool]) -> None:
    """The next proxy on the spill directory: it takes over the journal and commits it."""
    with LocalStack(settings, tmp_path / "logs-2") as stack:
        stack.proxy()
        deadline = time.monotonic() + 30
        while not stored() and time.monotonic() < deadline:
            time.sleep(0.1)


@pytest.mark.e2e
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["fdatasync", "write", "commit"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_call_answered_just_before_a_kill_9_is_stored(
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    stream: bool,
    mode: str,
) -> None:
    body = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    settings = _settings(pg_url, tmp_path, free_port(), mode)
    answer = _answer_then_kill(settings, tmp_path, rollout_id, body)
    if stream:
        assert answer.rstrip().endswith(b"data: [DONE]")
    if mode != "commit":  # in the journal when the answer left; stored once a proxy runs again
        assert len(_journaled_ids(tmp_path / "spill")) == 1
        _restart_proxy(settings, tmp_path, lambda: bool(_stored(db_session_factory, rollout_id)))
        assert _journaled_ids(tmp_path / "spill") == []  # committed, then removed
    calls = _stored(db_session_factory, rollout_id)
    assert [(c.seq, c.status_code, c.complete, c.stream) for c in calls] == [(0, 200, True, stream)]
    assert calls[0].completion_ids  # the whole capture, not a placeholder


# --- the writer alone ---------------------------------------------------------------------------


def _row(rollout_id: uuid.UUID) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(), "rollout_id": rollout_id, "seq": 0, "backend": "b", "model": "m",
        "api_type": "chat", "stream": False, "policy_version": 0, "status_code": 200,
        "complete": True, "request": {}, "response": {}, "prompt_ids": [1], "completion_ids": [2],
        "logprobs": [-0.5], "finish_reason": "stop", "latency_ms": 1.0, "ttft_ms": None,
        "created_at": datetime.now(UTC),
    }  # fmt: skip


@pytest.mark.anyio
async def test_durable_waits_for_the_commit_not_for_the_linger(
    pg_url: str, db_session_factory: sessionmaker[Session], rollout_id: uuid.UUID
) -> None:
    writer = DbCallWriter(pg_url, flush_interval_s=30.0)
    await writer.start()
    try:
        row = _row(rollout_id)
        started = time.monotonic()
        writer.submit(row)
        await asyncio.wait_for(writer.durable(), 10)
        assert time.monotonic() - started < 10  # not the 30 s linger
        assert [c.id for c in _stored(db_session_factory, rollout_id)] == [row["id"]]
    finally:
        await writer.close()


@pytest.mark.anyio
async def test_without_a_spill_directory_durable_gives_up_after_the_flush_timeout(
    rollout_id: uuid.UUID,
) -> None:
    """Database down, nowhere to spill: the answer goes out after `flush_timeout_s` (never
    held for ever), counted as late; the row stays queued, and a wait that ran out leaves no
    waiter behind to be settled twice."""
    down = DbCallWriter(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
        flush_timeout_s=0.3, retry_max_wait_s=0.05, close_timeout_s=0.3,
    )  # fmt: skip
    await down.start()
    try:
        down.submit(_row(rollout_id))
        started = time.monotonic()
        await asyncio.wait_for(down.durable(), 10)
        assert 0.25 <= time.monotonic() - started < 5
        assert down.stats()["durable_late"] == 1 and down.stats()["queued"] == 1
        down.submit(_row(rollout_id))
        await asyncio.wait_for(down.durable(), 10)
        assert down.stats()["durable_late"] == 2
    finally:
        await down.close()


@pytest.mark.anyio
async def test_durable_is_the_spill_fsync_while_the_database_is_down(
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
) -> None:
    """Unreachable database: durable() returns once the row is in a spill segment on disk, and
    a writer started later on that directory replays it (what a restarted proxy does)."""
    spill = tmp_path / "spill"
    down = DbCallWriter(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
        spill_dir=spill,
        spill_after_s=0.2,
        flush_interval_s=30.0,
    )
    await down.start()
    row = _row(rollout_id)
    down.submit(row)
    await asyncio.wait_for(down.durable(), 15)
    assert _journaled_ids(spill) == [str(row["id"])]  # on disk, fsynced, before the answer
    await down.close()  # the journal's commit fails: it becomes a spill segment, kept
    assert [p.name for p in spill.glob("**/*.seg")] == ["000000000000.seg"]
    assert _journaled_ids(spill) == [str(row["id"])]
    up = DbCallWriter(engine=create_db_engine(pg_url), spill_dir=spill)
    await up.start()
    try:
        await asyncio.wait_for(up.flush(), 15)
    finally:
        await up.close()
    assert [c.id for c in _stored(db_session_factory, rollout_id)] == [row["id"]]


@pytest.mark.anyio
async def test_answer_first_when_durable_answers_is_off(pg_url: str, rollout_id: uuid.UUID) -> None:
    writer = DbCallWriter(pg_url, flush_interval_s=30.0, durable_answers=False)
    await writer.start()
    try:
        writer.submit(_row(rollout_id))
        await asyncio.wait_for(writer.durable(), 1)  # returns at once: the row still lingers
        assert writer.pending == 1
    finally:
        await writer.close()
