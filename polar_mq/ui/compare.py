"""Jobs side by side: reward, no-signal fraction, throughput, tokens and latency per job.

The jobs are the ones picked on the page among the newest PICKER_JOBS the key may see (up to
MAX_JOBS; another tenant's or an older job is simply not offered), else the newest DEFAULT_JOBS.
The picker's page is read as the jobs list reads it (`ui.queries.jobs_activity`, one grouped
query), then each compared job costs two aggregate queries (its groups' signal, its agent calls'
totals), never a read of its rows, so ten jobs of 100k calls each stay cheap.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from polar_mq.models import LlmCall
from polar_mq.ui.job_plots import GroupSignal, agent_calls, group_signal, tokens_of
from polar_mq.ui.queries import JobActivity, jobs_activity

MAX_JOBS = 12
DEFAULT_JOBS = 8
PICKER_JOBS = 50
"""Newest jobs offered in the page's picker."""


@dataclass(frozen=True, slots=True)
class JobRow:
    activity: JobActivity
    signal: GroupSignal
    calls: int
    completion_tokens: int
    mean_latency_ms: float | None

    @property
    def tokens_per_rollout(self) -> float | None:
        n = self.activity.summary.terminal
        return self.completion_tokens / n if n else None


@dataclass(frozen=True, slots=True)
class Metric:
    """One compared quantity: its label, how to read it from a row, and its unit."""

    key: str
    label: str
    unit: str = ""


METRICS = (
    Metric("mean_reward", "Mean reward"),
    Metric("no_signal", "No-signal groups", "%"),
    Metric("rollouts_per_s", "Rollouts/s"),
    Metric("tokens_per_rollout", "Completion tokens per rollout"),
    Metric("latency", "Mean call latency", " ms"),
)


def metric_value(row: JobRow, key: str) -> float | None:
    if key == "mean_reward":
        return row.activity.mean_reward
    if key == "no_signal":
        fraction = row.signal.no_signal_fraction
        return None if fraction is None else 100 * fraction
    if key == "rollouts_per_s":
        return row.activity.rollouts_per_s
    if key == "tokens_per_rollout":
        return row.tokens_per_rollout
    return row.mean_latency_ms


def _calls(session: Session, job_id: uuid.UUID) -> tuple[int, int, float | None]:
    row = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(tokens_of(LlmCall.completion_ids)), 0),
            func.avg(LlmCall.latency_ms),
        ).where(*agent_calls(job_id))
    ).one()
    n, tokens, latency = row[0], row[1], row[2]
    return int(n), int(tokens), None if latency is None else float(latency)


def compare(session: Session, picked: list[uuid.UUID], tenant: str | None) -> dict[str, object]:
    """The compare page's context: a row per job, bars per metric, and the picker's jobs."""
    recent, _ = jobs_activity(session, PICKER_JOBS, None, tenant)
    known = {a.summary.job_id: a for a in recent}
    chosen = [j for j in dict.fromkeys(picked) if j in known][:MAX_JOBS] or [
        a.summary.job_id for a in recent[:DEFAULT_JOBS]
    ]
    rows = []
    for job_id in chosen:
        calls, tokens, latency = _calls(session, job_id)
        rows.append(JobRow(known[job_id], group_signal(session, job_id), calls, tokens, latency))
    return {
        "rows": rows,
        "metrics": METRICS,
        "value": metric_value,
        "recent": recent,
        "chosen": set(chosen),
    }
