"""What the retention bench times: the read queries the API serves, and the proxy's batch insert.

- results: `polar_mq.jobs.results.job_results` with trajectories (the trainer's page of 100
  groups, GET /v1/jobs/{id}/results?include_trajectories=true), on jobs inside the retention;
- calls: `polar_mq.rollouts.queries.rollout_calls` (GET /v1/rollouts/{id}/calls, the dashboard's
  calls of a rollout; the build stage reads the same rows by rollout id);
- trajectory: `polar_mq.rollouts.queries.rollout_trajectory`.

Each is run on the same random targets before and after the prune, each time after one
untimed pass over them (so neither side is timed on a cold cache); p50/p99 in milliseconds.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from polar_mq.infra.db import make_session_factory
from polar_mq.jobs.results import job_results
from polar_mq.proxy.store.call_insert import CallInserter
from polar_mq.rollouts.queries import rollout_calls, rollout_trajectory


def _pick(engine: Engine, sql: str, n: int, since: datetime) -> list[uuid.UUID]:
    with engine.connect() as conn:
        ids = list(conn.scalars(text(sql), {"since": since}))
    random.Random(7).shuffle(ids)
    return ids[:n]


def targets(engine: Engine, recent_days: float, n: int) -> dict[str, list[uuid.UUID]]:
    """Jobs and rollouts created in the last `recent_days` days (they survive the prune)."""
    since = datetime.now(UTC) - timedelta(days=recent_days)
    return {
        "jobs": _pick(engine, "SELECT id FROM jobs WHERE created_at >= :since", n, since),
        "rollouts": _pick(
            engine,
            "SELECT id FROM rollouts WHERE created_at >= :since "
            "AND created_at < now() - interval '1 day'",
            n,
            since,
        ),
    }


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": statistics.median(ordered), "p99_ms": p99, "n": len(ordered)}


def _time(engine: Engine, ids: list[uuid.UUID], query: Callable[[Session, Any], Any]) -> Any:
    factory = make_session_factory(engine)
    for target in ids:  # untimed pass: before and after are both timed on a warm cache
        with factory() as session:
            query(session, target)
    timings = []
    for target in ids:
        with factory() as session:
            started = time.perf_counter()
            query(session, target)
            timings.append((time.perf_counter() - started) * 1000)
    return _percentiles(timings)


def read_queries(engine: Engine, picked: dict[str, list[uuid.UUID]]) -> dict[str, Any]:
    return {
        "results": _time(
            engine,
            picked["jobs"],
            lambda s, j: job_results(s, j, limit=100, include_trajectories=True, settle_s=0),
        ),
        "calls": _time(engine, picked["rollouts"], rollout_calls),
        "trajectory": _time(engine, picked["rollouts"], rollout_trajectory),
    }


def insert_rate(engine: Engine, batches: int = 40, batch: int = 256) -> float:
    """Rows/s of the proxy's batch INSERT (`CallInserter`, the writer thread's statement)."""
    inserter = CallInserter(engine)
    prompt = list(range(1000))
    rows_total = 0
    started = time.perf_counter()
    for _ in range(batches):
        now = datetime.now(UTC)
        rows = [
            {
                "id": uuid.uuid4(),
                "rollout_id": uuid.uuid4(),
                "seq": i,
                "backend": "b0",
                "model": "m",
                "api_type": "chat",
                "stream": False,
                "policy_version": 0,
                "status_code": 200,
                "complete": True,
                "request": {"messages": [{"role": "user", "content": "x" * 2000}]},
                "response": {"choices": []},
                "prompt_ids": prompt,
                "completion_ids": prompt[:200],
                "logprobs": [0.0] * 200,
                "finish_reason": "stop",
                "latency_ms": 1.0,
                "ttft_ms": 1.0,
                "created_at": now,
            }
            for i in range(batch)
        ]
        with engine.begin() as conn:
            inserter.insert(conn, rows)
        rows_total += batch
    return rows_total / (time.perf_counter() - started)
