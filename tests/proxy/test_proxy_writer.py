"""The call writer on real PostgreSQL (and the embedded SQLite): batching, flush, drops, retries."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import psycopg
import pytest
from proxy_support import SECRET, proxy_settings
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.db import create_db_engine
from polar_mq.models import Base, LlmCall
from polar_mq.proxy import DbCallWriter, create_proxy_app
from polar_mq.proxy.store.call_insert import PG_ARRAY_TYPES
from polar_mq.testing.fake_vllm import create_fake_vllm_app
from polar_mq.testing.servers import free_port
from tests.conftest import module_database

# The module's fixtures are one database of its own (it counts every call row: a session stack's
# proxy on the same xdist worker may write rows into the session database), so xdist may spread it.
pytestmark = [pytest.mark.anyio, pytest.mark.spread]
pg_url, pg_engine = module_database("polar_mq_proxy_writer")


IDLE = {
    "queued": 0,
    "written": 0,
    "spilled_rows": 0,
    "spill_bytes": 0,
    "spilled_total": 0,
    "replayed": 0,
    "dropped": 0,
    "dropped_overflow": 0,
    "failed": 0,
    "refused": 0,
    "refused_kept": 0,
    "durable_late": 0,
    "journal_rows": 0,
    "groups": ANY,  # how the rows were grouped depends on timing
}
"""A writer's stats with nothing in flight (without a spill directory)."""


def call_row(seq: int = 0, **overrides: Any) -> dict[str, Any]:
    row = {
        "id": uuid.uuid4(),
        "rollout_id": uuid.uuid4(),
        "seq": seq,
        "backend": "http://upstream",
        "model": "fake-model",
        "api_type": "chat",
        "stream": False,
        "policy_version": 0,
        "status_code": 200,
        "complete": True,
        "request": {"messages": [{"role": "user", "content": "hi \u00e9"}]},
        "response": {"choices": []},
        "prompt_ids": list(range(100)),
        "completion_ids": [5, 6, 2],
        "logprobs": [-0.5, -0.25, -0.125],
        "finish_reason": "stop",
        "latency_ms": 12.5,
        "ttft_ms": None,
        "created_at": datetime.now(UTC),
        "purpose": "agent",
    }
    row.update(overrides)
    return row


def count(factory: sessionmaker[Session]) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).select_from(LlmCall)) or 0


@pytest.fixture
async def writer(
    pg_engine: Engine, db_session_factory: sessionmaker[Session]
) -> AsyncIterator[DbCallWriter]:
    w = DbCallWriter(engine=pg_engine, batch_size=64, flush_interval_s=0.02)
    await w.start()
    yield w
    await w.close()


def test_array_types_cover_every_column() -> None:
    assert list(PG_ARRAY_TYPES) == [c.name for c in LlmCall.__table__.columns]


async def test_proxy_calls_land_in_postgres_exactly(
    pg_engine: Engine, db_session_factory: sessionmaker[Session]
) -> None:
    """The real writer behind the proxy: stored rows equal what the upstream returned."""
    fake = create_fake_vllm_app()
    writer = DbCallWriter(engine=pg_engine)
    app = create_proxy_app(
        proxy_settings(), upstream_transport=httpx.ASGITransport(fake), sink=writer
    )
    rollout = uuid.uuid4()
    headers = {"authorization": f"Bearer {issue_rollout_token(SECRET, rollout, 60)}"}
    body = {"model": "agent", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as client,
        httpx.AsyncClient(transport=httpx.ASGITransport(fake), base_url="http://up") as upstream,
    ):
        for stream in (False, True):
            assert (
                await client.post(
                    "/v1/chat/completions", json={**body, "stream": stream}, headers=headers
                )
            ).status_code == 200
        flushed = await client.post("/admin/flush")
        assert flushed.json() == {**IDLE, "written": 2, "started_at": ANY}
        assert count(db_session_factory) == 2  # committed when flush returned
        direct = (
            await upstream.post(
                "/v1/chat/completions",
                json={**body, "model": "fake-model", "return_token_ids": True, "logprobs": True},
            )
        ).json()
    with db_session_factory() as session:
        rows = session.scalars(select(LlmCall).order_by(LlmCall.seq)).all()
    choice = direct["choices"][0]
    for row, stream in zip(rows, (False, True), strict=True):
        assert row.rollout_id == rollout and row.stream is stream and row.complete
        assert row.prompt_ids == direct["prompt_token_ids"]
        assert row.completion_ids == choice["token_ids"]
        assert row.logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
        assert row.request == {**body, "stream": stream}
        assert (row.api_type, row.model, row.finish_reason) == ("chat", "fake-model", "stop")
    assert (
        rows[0].response is not None
        and rows[0].response["choices"][0]["token_ids"] == choice["token_ids"]
    )
    assert rows[1].response is not None and rows[1].response["text"] == "CALC: 6 * 7"
    assert rows[1].ttft_ms is not None and rows[0].ttft_ms is None


async def test_flush_waits_for_commit_and_returns_immediately_when_idle(
    writer: DbCallWriter, db_session_factory: sessionmaker[Session]
) -> None:
    assert await writer.flush() == 0
    for i in range(150):  # more than two batches
        writer.submit(call_row(i))
    assert await writer.flush() == 150
    assert count(db_session_factory) == 150
    assert writer.stats() == {**IDLE, "written": 150}
    assert await asyncio.wait_for(writer.flush(), 1) == 150


async def test_full_queue_drops_and_counts(
    pg_engine: Engine, db_session_factory: sessionmaker[Session]
) -> None:
    writer = DbCallWriter(engine=pg_engine, queue_max=3)
    for i in range(5):  # not started yet: nothing drains the queue
        writer.submit(call_row(i))
    assert writer.stats()["dropped"] == 2
    await writer.start()
    assert await writer.flush() == 3
    await writer.close()
    assert count(db_session_factory) == 3


async def test_transient_errors_are_retried(
    pg_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    engine = create_db_engine(pg_url)
    failures = {"left": 2}

    @event.listens_for(engine, "before_cursor_execute")
    def flaky(*_: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    writer = DbCallWriter(engine=engine, retry_max_wait_s=0.05)
    await writer.start()
    writer.submit(call_row())
    assert await asyncio.wait_for(writer.flush(), 10) == 1
    await writer.close()
    engine.dispose()
    assert failures["left"] == 0 and count(db_session_factory) == 1


async def test_a_refused_row_does_not_block_its_batch(
    writer: DbCallWriter, db_session_factory: sessionmaker[Session]
) -> None:
    writer.submit(call_row(0))
    writer.submit(call_row(1, model="x" * 300))  # longer than the column allows
    writer.submit(call_row(2))
    assert await writer.flush() == 2
    assert writer.stats()["failed"] == writer.stats()["refused"] == 1
    assert count(db_session_factory) == 2


async def test_nul_characters_are_stored_losslessly(
    writer: DbCallWriter, db_session_factory: sessionmaker[Session]
) -> None:
    """PostgreSQL refuses NUL in jsonb; the call's JSON comes back exactly as sent (escaped on
    write, unescaped on read), the escape character itself included; the short `model` label
    column gets U+FFFD (the exact model stays in the request)."""
    content = "a\x00b, a literal \\u0000 and \\\x00, \uffff0 \uffff\uffff \x01\x7f\x9f\xff"
    row = call_row(
        request={"messages": [{"role": "user", "content": content}], "k\x00": "\x00"},
        response={"choices": [{"message": {"content": "\x00"}}]},
        engine_request={"messages": [{"role": "user", "content": content}]},
        model="m\x00",
    )
    writer.submit(row)
    assert await writer.flush() == 1
    assert writer.stats()["failed"] == 0
    with db_session_factory() as session:
        stored = session.scalars(select(LlmCall)).one()
        raw = session.execute(select(func.jsonb_typeof(LlmCall.request["messages"]))).scalar()
    assert stored.request == row["request"]
    assert stored.engine_request == row["engine_request"]
    assert stored.response == row["response"]
    assert stored.model == "m\ufffd"
    assert stored.prompt_ids == row["prompt_ids"] and stored.logprobs == row["logprobs"]
    assert raw == "array"  # the document keeps its shape for SQL


async def test_replayed_rows_are_ignored(
    writer: DbCallWriter, db_session_factory: sessionmaker[Session]
) -> None:
    row = call_row()
    writer.submit(row)
    writer.submit(dict(row))
    await writer.flush()
    assert count(db_session_factory) == 1 and writer.stats()["failed"] == 0


async def test_close_gives_up_on_an_unreachable_database() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    writer = DbCallWriter(url, close_timeout_s=0.3, retry_max_wait_s=0.05)
    await writer.start()
    writer.submit(call_row())
    await asyncio.wait_for(writer.close(), 5)
    assert writer.stats() == {**IDLE, "failed": 1}
    writer.submit(call_row())  # after close: counted, never blocks
    assert writer.stats()["dropped"] == 1


async def test_sqlite_embedded_default(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'calls.db'}"
    engine = create_db_engine(url)
    Base.metadata.create_all(engine, tables=[LlmCall.__table__])  # type: ignore[list-item]
    writer = DbCallWriter(url)
    await writer.start()
    rows = [call_row(i) for i in range(3)]
    for row in rows:
        writer.submit(row)
    assert await writer.flush() == 3
    await writer.close()
    with Session(engine) as session:
        stored = session.scalars(select(LlmCall).order_by(LlmCall.seq)).all()
    assert [r.id for r in stored] == [r["id"] for r in rows]
    assert stored[0].prompt_ids == rows[0]["prompt_ids"]
    assert stored[0].logprobs == rows[0]["logprobs"]
    assert stored[0].request == rows[0]["request"]
    engine.dispose()


async def test_a_connection_killed_while_idle_is_replaced_and_nothing_is_lost(
    pg_url: str,
    pg_engine: Engine,
    db_session_factory: sessionmaker[Session],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The writer sends no ping before a batch: a connection the server ended between two
    batches fails the next insert, which is sent again on a fresh connection, once."""
    writer = DbCallWriter(database_url=pg_url, retry_max_wait_s=0.05)
    await writer.start()
    before = count(db_session_factory)
    writer.submit(call_row(0))
    assert await asyncio.wait_for(writer.flush(), 10) == 1
    with pg_engine.connect() as conn:  # end the writer's connection (the only other client)
        killed = conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name = '' AND backend_type = 'client backend'"
            )
        ).all()
    assert killed, "the writer's connection was not found"
    writer.submit(call_row(1))
    with caplog.at_level(logging.WARNING, logger="polar_mq.proxy.store.call_store"):
        assert await asyncio.wait_for(writer.flush(), 10) == 2
    await writer.close()
    assert count(db_session_factory) == before + 2
    assert writer.stats()["failed"] == 0
    # the dead connection was found by the insert itself (no ping before it), then retried
    assert any("retrying" in r.getMessage() for r in caplog.records), caplog.text
