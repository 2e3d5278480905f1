"""Compare-and-set stage transitions: the fence that makes duplicated messages harmless.

`claim` moves a rollout from the stage's ready state to its busy state with a lease owner, in its
own committed transaction; only one delivery can win it. `finish` and `fail` write the stage's
result only while the same owner still holds the rollout in the busy state, so a redelivered copy,
or a worker whose lease was taken over, cannot write a second effect.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from polar_mq.models import Event, EventKind, Job, JobTask, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.workers.outbox import defer_publish
from polar_mq.workers.routing import Stage, StageMessage

S = RolloutStatus
STAGE_STATES: dict[Stage, tuple[str, str, str]] = {
    Stage.PREPARE: (S.QUEUED, S.PREPARING, S.PREPARED),
    Stage.RUN_AGENT: (S.PREPARED, S.RUNNING, S.RAN),
    Stage.BUILD: (S.RAN, S.BUILDING, S.BUILT),
    Stage.EVALUATE: (S.BUILT, S.EVALUATING, S.COMPLETED),
}

STAGE_OF_STATUS: dict[str, tuple[str, str]] = {}
"""Non-terminal rollout status → (stage, "queued" | "running")."""
for _stage, (_ready, _busy, _) in STAGE_STATES.items():
    STAGE_OF_STATUS[_ready] = (_stage.value, "queued")
    STAGE_OF_STATUS[_busy] = (_stage.value, "running")


class LeaseLost(RuntimeError):
    """The rollout is no longer held by this worker in this stage; its result is discarded."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A rollout won by one stage execution, with what the stage needs to read."""

    rollout: Rollout
    job: Job
    task: JobTask
    owner: str
    stage: Stage


def _rowcount(result: object) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


def _event(
    session: Session, rollout: Rollout, stage: Stage, kind: str, owner: str, **detail: Any
) -> None:
    session.add(
        Event(
            job_id=rollout.job_id,
            rollout_id=rollout.id,
            stage=stage.value,
            kind=kind,
            attempt=rollout.attempt,
            worker=owner,
            at=utcnow(),
            detail=detail,
        )
    )


def claim(
    session: Session, stage: Stage, rollout_id: uuid.UUID, owner: str, lease_s: float
) -> Claimed | str:
    """Win the rollout for `stage`, or return the status that made the claim fail."""
    ready, busy, _ = STAGE_STATES[stage]
    now = utcnow()
    values: dict[str, Any] = {
        "status": busy,
        "lease_owner": owner,
        "lease_expires_at": now + timedelta(seconds=lease_s),
    }
    if stage is Stage.PREPARE:
        values["started_at"] = func.coalesce(Rollout.started_at, now)
    won = _rowcount(
        session.execute(
            update(Rollout)
            .where(Rollout.id == rollout_id, Rollout.status == ready)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
    )
    rollout = session.get(Rollout, rollout_id, populate_existing=True)
    if rollout is None:
        return "missing"
    if not won:
        _event(session, rollout, stage, EventKind.SKIPPED, owner, status=rollout.status)
        return rollout.status
    _event(session, rollout, stage, EventKind.STARTED, owner)
    job = session.get_one(Job, rollout.job_id)
    task = session.get_one(JobTask, rollout.task_id)
    return Claimed(rollout, job, task, owner, stage)


def _fenced_update(session: Session, claimed: Claimed, values: dict[str, Any]) -> None:
    _, busy, _ = STAGE_STATES[claimed.stage]
    done = _rowcount(
        session.execute(
            update(Rollout)
            .where(
                Rollout.id == claimed.rollout.id,
                Rollout.status == busy,
                Rollout.lease_owner == claimed.owner,
            )
            .values(lease_owner=None, lease_expires_at=None, **values)
            .execution_options(synchronize_session=False)
        )
    )
    if done != 1:
        raise LeaseLost(f"rollout {claimed.rollout.id} left {claimed.stage} under another owner")


def finish(
    session: Session,
    claimed: Claimed,
    values: dict[str, Any],
    rows: list[Any],
    detail: dict[str, Any],
    next_message: StageMessage | None,
) -> None:
    """Record the stage's result and hand the rollout to the next stage (after commit)."""
    _, _, done = STAGE_STATES[claimed.stage]
    if done in RolloutStatus.TERMINAL:
        values = {**values, "finished_at": utcnow()}
    _fenced_update(session, claimed, {"status": done, **values})
    session.add_all(rows)
    _event(session, claimed.rollout, claimed.stage, EventKind.FINISHED, claimed.owner, **detail)
    if next_message is not None:
        defer_publish(session, next_message)


def fail(session: Session, claimed: Claimed, reason: str, error: str) -> None:
    """End the rollout as failed (an infrastructure failure: no reward)."""
    _fenced_update(
        session,
        claimed,
        {
            "status": RolloutStatus.FAILED,
            "termination_reason": reason,
            "error": error[-4000:],
            "reward": None,
            "finished_at": utcnow(),
        },
    )
    _event(
        session, claimed.rollout, claimed.stage, EventKind.FAILED, claimed.owner,
        reason=reason, error=error[-1000:],
    )  # fmt: skip


def current_status(session: Session, rollout_id: uuid.UUID) -> str | None:
    return session.scalar(select(Rollout.status).where(Rollout.id == rollout_id))
