"""A job's failures, retried attempts included: what `status` shows, and the stop that ends a job
whose rollouts all fail the same way on the platform's side.

Every failed attempt leaves an event (`requeued` when the rollout starts over, `failed` when it
ends) with its reason and error; the rollout row keeps only its last attempt's. So the errors are
read from the events, grouped by reason and *signature*: the error's last line, which is the
platform's verdict (`rollouts.agent_outcome` puts the why last), the same for every rollout that
met the same cause.

The platform stop (`stop_on_platform_failures`): when the last `PLATFORM_STOP_AFTER` failed
attempts of a job are all `backend_error` with one signature that every further attempt would
meet again (`jobs.verdicts`: the engine does not serve the job's model, or does not answer
at all; a proxy restart or a 5xx under load are transient and never stop a job), and no rollout
of the job has ended its agent with an agent outcome yet (the engine never served one run
through), the job's unfinished rollouts fail at once with that reason instead of each retrying
`retries.max_attempts` times. One agent outcome anywhere in the job means the engine works:
failures then are retried as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Table, insert, select, update
from sqlalchemy.orm import Session

from polar_mq.jobs.read_models import ErrorCount
from polar_mq.jobs.verdicts import PERSISTENT_CAUSES
from polar_mq.models import Event, EventKind, Rollout, RolloutStatus, TerminationReason
from polar_mq.models.base import utcnow

PLATFORM_STOP_AFTER = 5
"""Failed attempts in a row, one signature, no agent outcome yet: the job stops (see above)."""
ERRORS_READ = 500
"""The newest failure events a status reads (a job failing for ever does not slow it)."""
ERRORS_SHOWN = 5
FAILURE_KINDS = (EventKind.REQUEUED, EventKind.FAILED)
ROLLOUTS = cast(Table, Rollout.__table__)
R = ROLLOUTS.c


def signature(error: str | None) -> str:
    """The last non-empty line of an error: the same for every attempt with the same cause."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _failure_details(session: Session, job_id: uuid.UUID, limit: int) -> list[dict[str, Any]]:
    rows: Sequence[dict[str, Any] | None] = session.scalars(
        select(Event.detail)
        .where(
            Event.job_id == job_id,
            Event.rollout_id.is_not(None),
            Event.kind.in_(FAILURE_KINDS),
        )
        .order_by(Event.id.desc())
        .limit(limit)
    ).all()
    return [dict(row or {}) for row in rows]


def job_errors(session: Session, job_id: uuid.UUID) -> list[ErrorCount]:
    """The job's commonest failures (every attempt), most frequent first."""
    counts: dict[tuple[str | None, str], int] = {}
    for detail in _failure_details(session, job_id, ERRORS_READ):
        if not detail.get("error") and not detail.get("reason"):
            continue  # e.g. a resumed build: no failure of its own
        key = (detail.get("reason"), signature(detail.get("error")))
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:ERRORS_SHOWN]
    return [ErrorCount(reason, error, n) for (reason, error), n in ranked]


def _agent_outcome_seen(session: Session, job_id: uuid.UUID) -> bool:
    """Some rollout of the job ended its agent with an agent outcome (the engine served it)."""
    return (
        session.scalar(
            select(Rollout.id)
            .where(
                Rollout.job_id == job_id,
                Rollout.termination_reason.is_not(None),
                Rollout.termination_reason.not_in(list(TerminationReason.INFRASTRUCTURE)),
            )
            .limit(1)
        )
        is not None
    )


def platform_stop_reason(session: Session, job_id: uuid.UUID) -> str | None:
    """The signature the job's last failures share when the platform stop applies, else None."""
    recent = _failure_details(session, job_id, PLATFORM_STOP_AFTER)
    if len(recent) < PLATFORM_STOP_AFTER:
        return None
    if any(d.get("reason") != TerminationReason.BACKEND_ERROR for d in recent):
        return None
    signatures = {signature(d.get("error")) for d in recent}
    if len(signatures) != 1 or not next(iter(signatures)).startswith(PERSISTENT_CAUSES):
        return None
    if _agent_outcome_seen(session, job_id):
        return None
    return signatures.pop()


def stop_on_platform_failures(session: Session, job_id: uuid.UUID, worker: str) -> int:
    """Apply the platform stop if it applies: fail the job's unfinished rollouts with the shared
    reason (one conditional UPDATE: a rollout that ended meanwhile is left alone, a running
    agent loses its lease and is killed). The number of rollouts it failed."""
    why = platform_stop_reason(session, job_id)
    if why is None:
        return 0
    error = (
        f"job stopped early: its last {PLATFORM_STOP_AFTER} attempts failed the same way on the "
        f"platform's side and no rollout got an answer through: {why}"
    )
    now = utcnow()
    rows = session.execute(
        update(ROLLOUTS)
        .where(R.job_id == job_id, R.status.not_in(list(RolloutStatus.TERMINAL)))
        .values(
            status=RolloutStatus.FAILED,
            termination_reason=TerminationReason.BACKEND_ERROR,
            error=error,
            reward=None,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        )
        .returning(R.id, R.attempt)
    ).all()
    if rows:
        detail = {"reason": TerminationReason.BACKEND_ERROR, "error": error, "platform_stop": True}
        session.execute(
            insert(Event),
            [
                {
                    "job_id": job_id,
                    "rollout_id": row.id,
                    "stage": "platform_stop",
                    "kind": EventKind.FAILED,
                    "attempt": row.attempt,
                    "worker": worker,
                    "at": now,
                    "detail": detail,
                }
                for row in rows
            ],
        )
    return len(rows)
