"""Reads across a job's calls (staleness) and an attempt's (token budget) skip other days.

`llm_calls` is partitioned by day; a read that names no day scans every partition's index. The
job-wide bound is a scalar subquery on the job's creation, which PostgreSQL evaluates before the
scan and prunes with at run time: the days before the job are never executed.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import Engine, func, select, text

from polar_mq.calls import job_calls_window
from polar_mq.config import Settings
from polar_mq.models import LlmCall
from polar_mq.proxy.token_budget import db_budget_reader
from polar_mq.retention import partitions
from polar_mq.retention.maintenance import maintain
from tests.retention.conftest import NOW, call_row, days_ago, insert_calls, make_job


def job_of(engine: Engine, rollout_id: uuid.UUID) -> uuid.UUID:
    with engine.connect() as conn:
        found = conn.scalar(text("SELECT job_id FROM rollouts WHERE id = :r"), {"r": rollout_id})
    assert isinstance(found, uuid.UUID)
    return found


def test_a_job_wide_read_never_executes_the_days_before_the_job(engine: Engine) -> None:
    maintain(engine, Settings(call_partitions_ahead_days=30), now=days_ago(20))  # past days
    (old_rollout,) = make_job(engine, ["completed"])
    (rollout,) = make_job(engine, ["running"])
    insert_calls(engine, [call_row(old_rollout, 0, days_ago(15)), call_row(rollout, 0, NOW)])
    query = (
        select(func.count())
        .select_from(LlmCall)
        .where(LlmCall.rollout_id == rollout, job_calls_window(job_of(engine, rollout)))
    )
    with engine.connect() as conn:
        assert conn.scalar(query) == 1
        sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
        plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN ANALYZE " + sql)))
    old_day = partitions.day_name(partitions.day_start(days_ago(15)))
    today = partitions.day_name(partitions.day_start(NOW))
    scans = [line for line in plan.splitlines() if " on " in line and "llm_calls_" in line]
    assert any(today in line and "never executed" not in line for line in scans), plan
    assert all("never executed" in line for line in scans if old_day in line), plan
    assert any(old_day in line for line in scans) or "Subplans Removed" in plan, plan


def test_the_token_budget_counts_the_attempts_calls_in_its_days(engine: Engine) -> None:
    (rollout,) = make_job(engine, ["running"])
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET spec = '{\"max_tokens_per_rollout\": 100}' WHERE id = :j"),
            {"j": job_of(engine, rollout)},
        )
    insert_calls(engine, [call_row(rollout, i, NOW + timedelta(seconds=i)) for i in range(3)])
    assert db_budget_reader(engine)(rollout, 1) == (100, 6)  # 3 calls x 2 completion tokens
