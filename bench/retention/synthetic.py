"""Synthetic call history written by PostgreSQL itself (INSERT ... SELECT generate_series).

`calls` calls spread evenly over `days` days up to now: rollouts of `calls_per_rollout` calls
(seq 0..n-1, 2 s apart), jobs of 1,000 rollouts (125 groups of 8), one training sample per
rollout. Every rollout is completed except one rollout of one old job (about 0.8 of the way
back), which keeps that whole job "running": its calls are the ones the prune must keep.

Row sizes (defaults): the request JSON holds one user message of 128-736 characters (growing
with seq like an agent's history), the response one of 96, prompt ids 64 tokens, completion ids
and logprobs 16 each: about 1 KB per row with its indexes. Real agent calls are often larger
(whole conversations); `--scale` multiplies the payloads.

Day partitions for the past are created first, as the daily maintenance would have.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from polar_mq.retention import partitions

PER_JOB = 1000
TASKS = 125
GROUP = 8
CHUNK = 250_000


def _layout(calls: int, days: int, per_rollout: int) -> dict[str, object]:
    rollouts = max(PER_JOB, calls // per_rollout)
    t0 = datetime.now(UTC) - timedelta(days=days)
    return {
        "r": rollouts,
        "j": max(1, rollouts // PER_JOB),
        "c": per_rollout,
        "t0": t0,
        "step": days * 86400.0 / rollouts,
    }


def running_job(calls: int, days: int, per_rollout: int) -> int:
    """The index of the job left running (its calls are protected)."""
    return int(int(str(_layout(calls, days, per_rollout)["j"])) * 0.2)


def generate(
    engine: Engine, calls: int, days: int, per_rollout: int = 20, scale: int = 1
) -> dict[str, float]:
    """Write the history; returns seconds spent per phase."""
    p = _layout(calls, days, per_rollout)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    with engine.begin() as conn:
        day = partitions.day_start(p["t0"])  # type: ignore[arg-type]
        while day < partitions.day_start(datetime.now(UTC)):
            partitions.create_day(conn, day)
            day += timedelta(days=1)
        conn.execute(
            text(
                "INSERT INTO jobs (id, status, samples_per_task, n_tasks, spec, metadata, "
                "created_at, tenant) SELECT md5('job' || j)::uuid, 'active', :g, :t, '{}', '{}', "
                ":t0 + make_interval(secs => j * :per * :step), 'admin' "
                "FROM generate_series(0, :j - 1) j"
            ),
            {**p, "g": GROUP, "t": TASKS, "per": PER_JOB},
        )
        conn.execute(
            text(
                "INSERT INTO job_tasks (id, job_id, task_index, instance) "
                "SELECT j * :t + t + 1, md5('job' || j)::uuid, t, "
                "jsonb_build_object('instruction', 'task ' || t) "
                "FROM generate_series(0, :j - 1) j, generate_series(0, :t - 1) t"
            ),
            {**p, "t": TASKS},
        )
        conn.execute(text("SELECT setval('job_tasks_id_seq', :n)"), {"n": int(p["j"]) * TASKS})  # type: ignore[call-overload]
        conn.execute(
            text(
                "INSERT INTO rollouts (id, job_id, task_id, task_index, sample_index, status, "
                "attempt, termination_reason, reward, n_llm_calls, created_at, started_at, "
                "finished_at) SELECT md5('r' || k)::uuid, md5('job' || (k / :per))::uuid, "
                "(k / :per) * :t + (k % :per) / :g + 1, (k % :per) / :g, k % :g, 'completed', 1, "
                "'completed', (k % 3) / 2.0, :c, :t0 + make_interval(secs => k * :step), "
                ":t0 + make_interval(secs => k * :step), "
                ":t0 + make_interval(secs => k * :step + 60) FROM generate_series(0, :r - 1) k"
            ),
            {**p, "per": PER_JOB, "t": TASKS, "g": GROUP},
        )
        conn.execute(
            text(
                "UPDATE rollouts SET status = 'running', termination_reason = NULL, "
                "reward = NULL, finished_at = NULL WHERE id = md5('r' || :k)::uuid"
            ),
            {"k": running_job(calls, days, per_rollout) * PER_JOB},
        )
        conn.execute(
            text(
                "INSERT INTO trajectory_samples (rollout_id, attempt, sample_index, builder, "
                "prompt_ids, response_ids, loss_mask, logprobs, metadata, created_at) "
                "SELECT md5('r' || k)::uuid, 1, 0, 'prefix_merge', "
                "decode(repeat(md5(k::text), 64 * :s), 'hex'), "
                "decode(repeat(md5(k::text), 16 * :s), 'hex'), "
                "decode(repeat(md5(k::text), 16 * :s), 'hex'), "
                "decode(repeat(md5(k::text), 16 * :s), 'hex'), "
                "'{}', :t0 + make_interval(secs => k * :step + 60) "
                "FROM generate_series(0, :r - 1) k"
            ),
            {**p, "s": scale},
        )
    timings["jobs_rollouts_samples_s"] = time.perf_counter() - started
    started = time.perf_counter()
    total = int(p["r"]) * int(p["c"])  # type: ignore[call-overload]
    for lo in range(0, total, CHUNK):
        with engine.begin() as conn:
            conn.execute(
                text(_CALLS_SQL), {**p, "lo": lo, "hi": min(total, lo + CHUNK) - 1, "s": scale}
            )
        print(f"  calls {min(total, lo + CHUNK):>11,} / {total:,}", flush=True)
    timings["calls_s"] = time.perf_counter() - started
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    timings["vacuum_analyze_s"] = time.perf_counter() - started
    return timings


_CALLS_SQL = """
INSERT INTO llm_calls (id, rollout_id, seq, backend, model, api_type, stream, policy_version,
    status_code, complete, request, engine_request, response, prompt_ids, completion_ids,
    logprobs, finish_reason, latency_ms, ttft_ms, created_at, purpose, attempt)
SELECT gen_random_uuid(), md5('r' || (g / :c))::uuid, g % :c, 'b0', 'm', 'chat', false, 0, 200,
    true,
    jsonb_build_object('model', 'm', 'messages', jsonb_build_array(jsonb_build_object(
        'role', 'user', 'content', repeat(md5(g::text), (4 + g % :c) * :s)))),
    NULL,
    jsonb_build_object('choices', jsonb_build_array(jsonb_build_object('message',
        jsonb_build_object('role', 'assistant', 'content', repeat(md5((g + 1)::text), 3 * :s))))),
    decode(repeat(md5(g::text), 16 * :s), 'hex'), decode(repeat(md5(g::text), 4 * :s), 'hex'),
    decode(repeat(md5(g::text), 4 * :s), 'hex'), 'stop', 100 + g % 50, 10,
    :t0 + make_interval(secs => (g / :c) * :step + (g % :c) * 2), 'agent', 1
FROM generate_series(:lo, :hi) g
"""
