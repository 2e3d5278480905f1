"""What a call waits for its row (`DbCallWriter.durable`), and what of it is the commit's flush.

`python -m bench.proxy.durable [--calls 300] [--pg-admin-url URL]`. The proxy's writer in this
process against a fresh database: a call's row submitted and waited for, one call at a time
(p50/p90), then 64 at once (rows/s: the group commit); and the bare single-row INSERT's commit
with `synchronous_commit` on and off (how much of the wait is the WAL flush to disk).
Figures: docs/multihost.md ("Durable answers").
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from bench.pipeline.infra import fresh_database
from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.proxy.store.call_insert import CallInserter
from polar_mq.proxy.store.writer import DbCallWriter
from polar_mq.proxy.store.writer_engine import PG_CONNECT_ARGS

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _row(rollout_id: uuid.UUID) -> dict[str, Any]:
    """A small chat call: 300 prompt and 32 completion tokens."""
    return {
        "id": uuid.uuid4(), "rollout_id": rollout_id, "seq": 0, "backend": "b", "model": "m",
        "api_type": "chat", "stream": False, "policy_version": 0, "status_code": 200,
        "complete": True, "request": {"messages": [{"role": "user", "content": "x" * 200}]},
        "response": {"content": "y" * 200}, "prompt_ids": list(range(300)),
        "completion_ids": list(range(32)), "logprobs": [-0.5] * 32, "finish_reason": "stop",
        "latency_ms": 1.0, "ttft_ms": None, "created_at": datetime.now(UTC),
    }  # fmt: skip


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _writer(url: str, rollout_id: uuid.UUID, calls: int) -> None:
    writer = DbCallWriter(url)
    await writer.start()
    try:
        for _ in range(20):  # warm-up
            writer.submit(_row(rollout_id))
            await writer.durable()
        alone: list[float] = []
        for _ in range(calls):
            started = time.perf_counter()
            writer.submit(_row(rollout_id))
            await writer.durable()
            alone.append(time.perf_counter() - started)
            await asyncio.sleep(0.002)
        print(f"one call at a time: p50 {_pct(alone, 0.5):.2f} ms, p90 {_pct(alone, 0.9):.2f} ms")

        async def one() -> float:
            started = time.perf_counter()
            writer.submit(_row(rollout_id))
            await writer.durable()
            return time.perf_counter() - started

        waits: list[float] = []
        started = time.perf_counter()
        for _ in range(max(1, calls // 64)):
            waits += await asyncio.gather(*[one() for _ in range(64)])
        rate = len(waits) / (time.perf_counter() - started)
        print(f"64 at once: {rate:.0f} rows/s, p50 {_pct(waits, 0.5):.2f} ms per call")
    finally:
        await writer.close()


def _commits(url: str, rollout_id: uuid.UUID, calls: int) -> None:
    engine = create_db_engine(
        url, pool_size=1, max_overflow=0, connect_args=PG_CONNECT_ARGS,
        isolation_level="AUTOCOMMIT",
    )  # fmt: skip
    inserter = CallInserter(engine)
    try:
        for setting in ("on", "off"):
            times: list[float] = []
            with engine.connect() as conn:
                conn.exec_driver_sql(f"SET synchronous_commit = {setting}")
                for _ in range(calls):
                    started = time.perf_counter()
                    inserter.insert(conn, [_row(rollout_id)])
                    times.append(time.perf_counter() - started)
            print(
                f"single-row INSERT, synchronous_commit {setting}: p50 {_pct(times, 0.5):.2f} ms, "
                f"p90 {_pct(times, 0.9):.2f} ms"
            )
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG)
    args = parser.parse_args()
    with fresh_database(args.pg_admin_url, "polar_mq_bench_durable") as (url, _):
        factory = make_session_factory(create_db_engine(url))
        with unit_of_work(factory) as session:
            spec = JobCreate.model_validate({"tasks": [{"instruction": "x"}]})
            job = create_job(session, spec, "bench")
        rollout_id = uuid.UUID(str(job.rollout_ids[0]))
        asyncio.run(_writer(url, rollout_id, args.calls))
        _commits(url, rollout_id, args.calls)


if __name__ == "__main__":
    main()
