"""Search the rollouts a key may see by task text, status and termination reason.

The task text is matched case-insensitively as a substring of the task's `instruction` (in SQL,
`LIKE` with the pattern's wildcards escaped); status and reason must be known words, so a typo is
told, not answered with an empty page. The newest ROLLOUTS_SHOWN matches are listed, and the jobs
they belong to with how many of their rollouts match (the first JOBS_SHOWN jobs).

There is no text index: a text search reads the tasks of the tenant's jobs (the page is for
people, a few searches a minute, not for trainers); status and reason narrow through the rollouts'
status index first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from polar_mq.models import Job, JobTask, Rollout, RolloutStatus, TerminationReason

ROLLOUTS_SHOWN = 100
JOBS_SHOWN = 50
QUERY_CHARS = 200
REASONS = tuple(sorted(TerminationReason.AGENT | TerminationReason.INFRASTRUCTURE))
SNIPPET_CHARS = 160


class SearchError(ValueError):
    """A search the page refuses, with the message it shows."""


@dataclass(frozen=True, slots=True)
class SearchQuery:
    text: str = ""
    status: str = ""
    reason: str = ""

    @property
    def empty(self) -> bool:
        return not (self.text or self.status or self.reason)


def parse_query(text: str | None, status: str | None, reason: str | None) -> SearchQuery:
    """The form's values checked; SearchError names what is wrong and what is allowed."""
    text = (text or "").strip()
    if len(text) > QUERY_CHARS:
        raise SearchError(f"the task text is limited to {QUERY_CHARS} characters")
    status = (status or "").strip()
    if status and status not in RolloutStatus.ALL:
        raise SearchError(f"unknown status {status!r}; one of {', '.join(RolloutStatus.ALL)}")
    reason = (reason or "").strip()
    if reason and reason not in REASONS:
        raise SearchError(f"unknown termination reason {reason!r}; one of {', '.join(REASONS)}")
    return SearchQuery(text, status, reason)


@dataclass(frozen=True, slots=True)
class RolloutHit:
    rollout_id: uuid.UUID
    job_id: uuid.UUID
    task_index: int
    sample_index: int
    status: str
    termination_reason: str | None
    reward: float | None
    created_at: datetime
    instruction: str


@dataclass(frozen=True, slots=True)
class JobHit:
    job_id: uuid.UUID
    name: str | None
    matches: int


@dataclass(frozen=True, slots=True)
class SearchResults:
    rollouts: list[RolloutHit]
    jobs: list[JobHit]


def _conditions(query: SearchQuery, tenant: str | None) -> list[Any]:
    where: list[Any] = []
    if tenant is not None:
        where.append(Job.tenant == tenant)
    if query.status:
        where.append(Rollout.status == query.status)
    if query.reason:
        where.append(Rollout.termination_reason == query.reason)
    if query.text:
        instruction = JobTask.instance["instruction"].as_string()
        where.append(instruction.icontains(query.text, autoescape=True))
    return where


def search(session: Session, query: SearchQuery, tenant: str | None) -> SearchResults:
    """Matching rollouts (newest first) and their jobs, for `tenant` (None: every tenant)."""
    if query.empty:
        return SearchResults([], [])
    where = _conditions(query, tenant)
    snippet = func.substr(JobTask.instance["instruction"].as_string(), 1, SNIPPET_CHARS)
    rows = session.execute(
        select(
            Rollout.id,
            Rollout.job_id,
            Rollout.task_index,
            Rollout.sample_index,
            Rollout.status,
            Rollout.termination_reason,
            Rollout.reward,
            Rollout.created_at,
            snippet,
        )
        .join(JobTask, JobTask.id == Rollout.task_id)
        .join(Job, Job.id == Rollout.job_id)
        .where(*where)
        .order_by(Rollout.created_at.desc(), Rollout.task_index, Rollout.sample_index)
        .limit(ROLLOUTS_SHOWN)
    ).tuples()
    rollouts = [
        RolloutHit(rid, job, task, sample, status, reason, reward, created, text or "")
        for rid, job, task, sample, status, reason, reward, created, text in rows
    ]
    counts = session.execute(
        select(Rollout.job_id, func.count())
        .join(JobTask, JobTask.id == Rollout.task_id)
        .join(Job, Job.id == Rollout.job_id)
        .where(*where)
        .group_by(Rollout.job_id, Job.created_at)
        .order_by(Job.created_at.desc())
        .limit(JOBS_SHOWN)
    ).all()
    names: dict[uuid.UUID, Any] = {
        job_id: meta
        for job_id, meta in session.execute(
            select(Job.id, Job.meta).where(Job.id.in_([job_id for job_id, _ in counts]))
        ).tuples()
    }
    jobs = [JobHit(job_id, _name(names.get(job_id)), int(n)) for job_id, n in counts]
    return SearchResults(rollouts, jobs)


def _name(meta: Any) -> str | None:
    name = meta.get("name") if isinstance(meta, dict) else None
    return str(name) if name is not None else None
