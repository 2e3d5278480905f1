"""(d) Call records/s the proxy's log writer stores in PostgreSQL, 1k tokens per record.

The very `DbCallWriter` the proxy runs (its own thread and connection, batches of
`log_batch_size` rows as one `INSERT ... SELECT FROM unnest(...) ON CONFLICT (id) DO NOTHING`),
fed `rows` records as fast as `submit` takes them; the clock stops when `flush()` returns, i.e.
when the last batch is committed. For comparison the same rows go through PostgreSQL COPY into a
temporary table followed by one `INSERT ... SELECT ... ON CONFLICT DO NOTHING` per batch (COPY
alone cannot skip duplicates, which the spill replay needs), on one connection in this process.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from polar_mq.proxy.store.call_insert import PG_ARRAY_TYPES, pg_columns
from polar_mq.proxy.store.writer import DbCallWriter

PROMPT_TOKENS = 768
COMPLETION_TOKENS = 256
"""1,024 tokens per record, logprobs for the completion."""


def sample_rows(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    prompt = [rng.randrange(50_000) for _ in range(PROMPT_TOKENS)]
    rows = []
    for i in range(n):
        completion = [rng.randrange(50_000) for _ in range(COMPLETION_TOKENS)]
        rows.append(
            {
                "id": uuid.uuid4(),
                "rollout_id": uuid.uuid4(),
                "seq": i % 8,
                "backend": "http://127.0.0.1:8011",
                "model": "fake-model",
                "api_type": "chat",
                "stream": False,
                "policy_version": 0,
                "status_code": 200,
                "complete": True,
                "request": {"model": "agent", "messages": [{"role": "user", "content": "x" * 600}]},
                "response": {"choices": [{"message": {"content": "y" * 400}}]},
                "prompt_ids": prompt,
                "completion_ids": completion,
                "logprobs": [-rng.random() for _ in range(COMPLETION_TOKENS)],
                "finish_reason": "stop",
                "latency_ms": 21.5,
                "ttft_ms": None,
                "created_at": datetime.now(UTC),
                "purpose": "agent",
            }
        )
    return rows


def _fresh_ids(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "id": uuid.uuid4()} for row in rows]


async def _writer_run(database_url: str, rows: list[dict[str, Any]], batch_size: int) -> float:
    writer = DbCallWriter(database_url, batch_size=batch_size, queue_max=len(rows) + 1)
    await writer.start()
    await writer.flush()  # connected
    started = time.perf_counter()
    for row in rows:
        writer.submit(row)
    written = await writer.flush()
    elapsed = time.perf_counter() - started
    await writer.close()
    assert written == len(rows), (written, len(rows))
    return len(rows) / elapsed


def writer_rate(database_url: str, rows: list[dict[str, Any]], batch_size: int = 256) -> float:
    """Records/s through the proxy's writer (unnest INSERT)."""
    return asyncio.run(_writer_run(database_url, _fresh_ids(rows), batch_size))


def copy_rate(database_url: str, rows: list[dict[str, Any]], batch_size: int = 256) -> float:
    """Records/s through COPY into a temporary table + INSERT ... ON CONFLICT, per batch."""
    rows = _fresh_ids(rows)
    names = list(PG_ARRAY_TYPES)
    columns = ", ".join(names)
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "CREATE TEMP TABLE calls_in (LIKE llm_calls INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        conn.commit()
        started = time.perf_counter()
        for start in range(0, len(rows), batch_size):
            batch = pg_columns(rows[start : start + batch_size])
            with conn.cursor() as cur:
                with cur.copy(f"COPY calls_in ({columns}) FROM STDIN") as copy:
                    for values in zip(*(batch[n] for n in names), strict=True):
                        copy.write_row(values)
                cur.execute(
                    f"INSERT INTO llm_calls ({columns}) SELECT {columns} FROM calls_in "
                    "ON CONFLICT (id) DO NOTHING"
                )
            conn.commit()
        elapsed = time.perf_counter() - started
    return len(rows) / elapsed
