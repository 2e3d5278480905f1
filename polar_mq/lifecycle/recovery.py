"""What happens to a rollout when a stage cannot finish normally.

Three ways back, all compare-and-set UPDATEs fenced like every other transition, so a recovery
racing a late result (or another sweeper) takes effect at most once:

- `retry_in_place`: a stage raised unexpectedly; the rollout goes back to the stage's ready state
  and the same message is sent again after a backoff (bounded by `retries.stage_retries`).
- `restart`: the attempt is lost (its worker died, or the agent stage broke); the rollout starts
  over from prepare with attempt+1 in a fresh runtime, or fails `worker_lost`/`runtime_error` once
  the job's `retries.max_attempts` are used up. LLM calls, samples and evaluations are all per
  attempt, so nothing of the lost attempt leaks into the new one.
- `resume`: a DB-only stage (build) whose worker died is simply handed back to its queue.

And one way forward for a rollout whose message was lost (`republish`): the same message again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.orm import Session

from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import defer_publish
from polar_mq.lifecycle.priority import DEFAULT_PRIORITY
from polar_mq.lifecycle.stages import STAGE_STATES, Stage
from polar_mq.lifecycle.transitions import EVENTS, ROLLOUTS, Claimed, R, _fenced_update, _rowcount
from polar_mq.models import EventKind, RolloutStatus, TerminationReason
from polar_mq.models.base import utcnow

MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True)
class LostAttempt:
    """A rollout caught in a busy state by someone other than its lease owner."""

    id: uuid.UUID
    job_id: uuid.UUID
    status: str
    attempt: int
    lease_owner: str | None
    pool: str
    max_attempts: int
    priority: int = DEFAULT_PRIORITY
    """The job's priority, carried by the message that sends the rollout on again."""


def backoff_s(retries: int, base_s: float) -> float:
    """Exponential backoff between in-place retries: base, 2·base, 4·base … capped."""
    return float(min(MAX_BACKOFF_S, base_s * (2**retries)))


def _event(
    session: Session,
    rollout_id: uuid.UUID,
    job_id: uuid.UUID,
    stage: str,
    kind: str,
    attempt: int,
    worker: str,
    **detail: Any,
) -> None:
    session.connection().execute(
        EVENTS.insert(),
        {
            "job_id": job_id,
            "rollout_id": rollout_id,
            "stage": stage,
            "kind": kind,
            "attempt": attempt,
            "worker": worker,
            "at": utcnow(),
            "detail": detail,
        },
    )


def retry_in_place(
    session: Session, claimed: Claimed, message: StageMessage, error: str, delay_s: float
) -> None:
    """Hand the stage back to its queue after `delay_s`; the runtime (if any) is kept."""
    ready, _, _ = STAGE_STATES[claimed.stage]
    _fenced_update(session, claimed, {"status": ready})
    _event(
        session, claimed.rollout.id, claimed.rollout.job_id, claimed.stage.value,
        EventKind.RETRIED, claimed.rollout.attempt, claimed.owner,
        retry=message.retries, delay_s=delay_s, error=error[-1000:],
    )  # fmt: skip
    defer_publish(session, message)


_WHERE_LOST = (
    R.id == bindparam("b_id"),
    R.status == bindparam("b_status"),
    R.attempt == bindparam("b_attempt"),
    R.lease_owner.is_not_distinct_from(bindparam("b_owner")),
)
_RESTART = (
    update(ROLLOUTS)
    .where(*_WHERE_LOST)
    .values(
        status=RolloutStatus.QUEUED,
        attempt=R.attempt + 1,
        node=None,
        runtime_id=None,
        lease_owner=None,
        lease_expires_at=None,
        termination_reason=None,
        agent_exit_code=None,
        reward=None,
        n_llm_calls=None,
        started_at=None,
        error=bindparam("b_error"),
    )
)
_GIVE_UP = update(ROLLOUTS).where(*_WHERE_LOST)
_RESUME = update(ROLLOUTS).where(*_WHERE_LOST)


class Recovery(StrEnum):
    """What a recovery did to a rollout; the value is the word the sweeper's report and the
    run-agent stage's `restart:` result have always used."""

    REQUEUED = "requeued"
    """Started over from prepare, in a new attempt."""
    FAILED = "failed"
    """Given up: its attempts were used up."""
    RESUMED = "resumed"
    """A database-only stage sent back to its queue in the same attempt."""
    RACED = "raced"
    """Someone else moved the rollout first: nothing was done."""


def restart(
    session: Session, lost: LostAttempt, reason: str, error: str, worker: str, stage: str
) -> Recovery:
    """Start the rollout over from prepare (attempt+1), or fail it when attempts are used up;
    `RACED` when someone else moved it first."""
    params = {
        "b_id": lost.id,
        "b_status": lost.status,
        "b_attempt": lost.attempt,
        "b_owner": lost.lease_owner,
    }
    if lost.attempt >= lost.max_attempts:
        values = {
            "status": RolloutStatus.FAILED,
            "termination_reason": reason,
            "error": f"gave up after {lost.attempt} attempt(s): {error}"[-4000:],
            "reward": None,
            "finished_at": utcnow(),
            "lease_owner": None,
            "lease_expires_at": None,
        }
        if _rowcount(session.connection().execute(_GIVE_UP, {**params, **values})) != 1:
            return Recovery.RACED
        _event(
            session, lost.id, lost.job_id, stage, EventKind.FAILED, lost.attempt, worker,
            reason=reason, error=error[-1000:], attempts=lost.attempt,
        )  # fmt: skip
        return Recovery.FAILED
    restarted = session.connection().execute(_RESTART, {**params, "b_error": error[-4000:]})
    if _rowcount(restarted) != 1:
        return Recovery.RACED
    _event(
        session, lost.id, lost.job_id, stage, EventKind.REQUEUED, lost.attempt + 1, worker,
        reason=reason, error=error[-1000:], previous_attempt=lost.attempt,
    )  # fmt: skip
    defer_publish(
        session,
        StageMessage(
            Stage.PREPARE, lost.id, lost.pool, attempt=lost.attempt + 1, priority=lost.priority
        ),
    )
    return Recovery.REQUEUED


def resume(session: Session, lost: LostAttempt, stage: Stage, worker: str) -> Recovery:
    """Give a DB-only stage back to its queue in the same attempt; `RESUMED` or `RACED`."""
    ready, busy, _ = STAGE_STATES[stage]
    params = {
        "b_id": lost.id,
        "b_status": busy,
        "b_attempt": lost.attempt,
        "b_owner": lost.lease_owner,
        "status": ready,
        "lease_owner": None,
        "lease_expires_at": None,
    }
    if _rowcount(session.connection().execute(_RESUME, params)) != 1:
        return Recovery.RACED
    _event(
        session, lost.id, lost.job_id, stage.value, EventKind.REQUEUED, lost.attempt, worker,
        reason=TerminationReason.WORKER_LOST, resumed=True,
    )  # fmt: skip
    defer_publish(
        session,
        StageMessage(stage, lost.id, lost.pool, attempt=lost.attempt, priority=lost.priority),
    )
    return Recovery.RESUMED


def restart_claimed(
    session: Session, claimed: Claimed, pool: str, reason: str, error: str
) -> Recovery:
    """`restart` for a stage that still holds its claim (the agent stage broke unexpectedly)."""
    _, busy, _ = STAGE_STATES[claimed.stage]
    lost = LostAttempt(
        claimed.rollout.id,
        claimed.rollout.job_id,
        busy,
        claimed.rollout.attempt,
        claimed.owner,
        pool,
        claimed.spec.retries.max_attempts,
        claimed.spec.priority,
    )
    return restart(session, lost, reason, error, claimed.owner, claimed.stage.value)


def republish(
    session: Session,
    message: StageMessage,
    job_id: uuid.UUID,
    worker: str,
    now: datetime,
    queue: str,
) -> None:
    """Send a waiting rollout's stage message again (the first one was lost).

    A duplicate is harmless (claims are compare-and-set); the `republished` event it writes also
    rate-limits the next attempt.
    """
    session.execute(
        EVENTS.insert(),
        {
            "job_id": job_id,
            "rollout_id": message.rollout_id,
            "stage": message.stage.value,
            "kind": EventKind.REPUBLISHED,
            "attempt": message.attempt,
            "worker": worker,
            "at": now,
            "detail": {"queue": queue},
        },
    )
    defer_publish(session, message)
