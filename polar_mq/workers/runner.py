"""The behaviour every stage shares, in one place: claim, run, record, hand over, clean up.

A Celery task calls `run_stage`; it claims the rollout (a duplicate delivery stops here), runs the
stage module, and commits the result fenced by the claim, publishing the next stage after commit.
An infrastructure failure ends the rollout as failed with its reason; the runtime is released when
the rollout leaves the node for good.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from polar_mq.infra.db import unit_of_work
from polar_mq.infra.imports import allowing
from polar_mq.jobs.early_stop import after_rollout_ended
from polar_mq.jobs.failures import stop_on_platform_failures
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import publish_committed
from polar_mq.lifecycle.recovery import Recovery, backoff_s, restart_claimed, retry_in_place
from polar_mq.lifecycle.stages import NEXT_STAGE, STAGE_STATES, Stage
from polar_mq.lifecycle.transitions import (
    Claimed,
    LeaseLost,
    claim,
    fail,
    finish,
    finish_in_one,
    runtime_released,
)
from polar_mq.models import RolloutStatus, TerminationReason
from polar_mq.models.base import utcnow
from polar_mq.observability import context as log_context
from polar_mq.observability.stage_metrics import observe_outcome
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.run_result import RunResult
from polar_mq.workers.stages import build, evaluate, prepare, run_agent
from polar_mq.workers.stages.common import StageFailure, StageRestart, release_runtime
from polar_mq.workers.stages.grading_runtime import release_grading_runtime
from polar_mq.workers.stages.outcomes import Rows, StageOutcome

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")

STAGE_FUNCTIONS: dict[Stage, Callable[[WorkerContext, Claimed], StageOutcome]] = {
    Stage.PREPARE: prepare.run,
    Stage.RUN_AGENT: run_agent.run,
    Stage.BUILD: build.run,
    Stage.EVALUATE: evaluate.run,
}
RUNTIME_STAGES = frozenset({Stage.PREPARE, Stage.RUN_AGENT, Stage.EVALUATE})


@dataclass(frozen=True, slots=True)
class _Record:
    """A stage's outcome as committed (`lifecycle.transitions.finish`): the rollout's columns,
    the rows per table and the `finished` event's detail."""

    values: dict[str, Any]
    rows: Rows
    detail: dict[str, Any]


def _release_runtime(ctx: WorkerContext, claimed: Claimed, reusable: bool = False) -> None:
    """Recycle or destroy the rollout's runtime, then log how (a `runtime_released` event); stop
    its evaluation runtime too when the job grades in its own.

    After the stage's result is committed, never before: a redelivered evaluate must still find
    the runtime, and a recycled one may already belong to another rollout.
    """
    runtime_spec = claimed.spec.runtime
    try:
        detail = release_runtime(
            ctx.settings, ctx.warm_pool, runtime_spec, claimed.rollout, reusable=reusable
        )
        _on_connection(ctx, lambda conn: runtime_released(conn, claimed, detail))
    except Exception:
        log.exception("releasing the runtime of rollout %s failed", claimed.rollout.id)
    try:  # on its own: a failed release above must not keep the grader alive
        release_grading_runtime(ctx.settings, runtime_spec, claimed.rollout)
    except Exception:
        log.exception("releasing the evaluation runtime of rollout %s failed", claimed.rollout.id)


def _next_message(
    ctx: WorkerContext, claimed: Claimed, outcome: StageOutcome
) -> StageMessage | None:
    nxt = NEXT_STAGE[claimed.stage]
    if nxt is None:
        return None
    node = outcome.next_node() or claimed.rollout.node
    pool = claimed.spec.pool
    return StageMessage(
        nxt, claimed.rollout.id, pool, node,
        attempt=claimed.rollout.attempt, priority=claimed.spec.priority,
    )  # fmt: skip


DB_ATTEMPTS = 3


def _retry_db(fn: Callable[P, T]) -> Callable[P, T]:
    """Run `fn` again (up to `DB_ATTEMPTS` in all, 0.1 s then 0.2 s apart) when it raises
    `OperationalError`: a dropped database connection is invalidated by the pool, and the retry
    gets a fresh one. A plain loop rather than tenacity: it wraps the claim and commit of every
    stage, and tenacity's per-call bookkeeping cost more than the retry ever does."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, DB_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except OperationalError:
                if attempt == DB_ATTEMPTS:
                    raise
                time.sleep(min(2.0, 0.1 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    return wrapper


@_retry_db
def _on_connection(ctx: WorkerContext, write: Callable[[Connection], T]) -> T:
    """Run `write`, one statement that publishes nothing, in autocommit on a bare connection."""
    with ctx.autocommit_engine.connect() as conn:
        result = write(conn)
        conn.commit()  # a no-op in autocommit; the transaction of other dialects
        return result


@_retry_db
def _claim(
    ctx: WorkerContext, stage: Stage, rollout_id: str, owner: str, attempt: int | None
) -> Claimed | str:
    # One statement in autocommit (lifecycle.fused) on a bare connection: the claim publishes
    # nothing after commit, so it needs no session.
    with ctx.autocommit_engine.connect() as conn:
        claimed = claim(
            conn, stage, uuid.UUID(rollout_id), owner, ctx.settings.lease_s,
            ctx.spec_cache, attempt,
        )  # fmt: skip
        conn.commit()  # a no-op in autocommit; the transaction of other dialects
        return claimed


@_retry_db
def _commit(ctx: WorkerContext, write: Callable[[Session], T], atomic: bool = True) -> T:
    """Run `write` in a transaction, or (`atomic=False`, for a write that is one statement) in
    autocommit mode, which spares the BEGIN and COMMIT round trips."""
    factory = ctx.session_factory if atomic else ctx.autocommit_factory
    with unit_of_work(factory) as session:
        return write(session)


def _finish(
    ctx: WorkerContext, claimed: Claimed, record: _Record, next_message: StageMessage | None
) -> None:
    """Commit the stage's result, then publish the next stage.

    On PostgreSQL the whole finish, rows included, is one statement (`finish_in_one`), sent in
    autocommit on a bare connection: no BEGIN and COMMIT round trips, no session; the next
    stage is published once it returned. Otherwise (or with more rows than one statement
    carries) a transaction, publishing after its commit."""
    record = _with_waiting_lease(ctx, claimed, record)
    if _finish_in_one(ctx, claimed, record):
        publish_committed(ctx.publisher, [next_message] if next_message is not None else [])
        return
    _commit(
        ctx,
        lambda session: finish(
            session, claimed, record.values, record.rows, record.detail, next_message
        ),
    )


def _with_waiting_lease(ctx: WorkerContext, claimed: Claimed, record: _Record) -> _Record:
    """A rollout that will wait in its node's own queue (prepared, built) leaves with a lease the
    node's keeper renews (`waiting_leases`): a node that dies before its keeper's first renewal
    leaves the rollout to expire and be started over, instead of stranding it forever."""
    next_stage = NEXT_STAGE[claimed.stage]
    if next_stage is None or not next_stage.node_local:
        return record
    expires = utcnow() + timedelta(seconds=ctx.settings.lease_s)
    return replace(record, values={**record.values, "lease_expires_at": expires})


@_retry_db
def _finish_in_one(ctx: WorkerContext, claimed: Claimed, record: _Record) -> bool:
    with ctx.autocommit_engine.connect() as conn:
        done = finish_in_one(conn, claimed, record.values, record.rows, record.detail)
        conn.commit()  # a no-op in autocommit
        return done


def run_stage(
    ctx: WorkerContext,
    stage: Stage,
    rollout_id: str,
    task_id: str | None,
    attempt: int | None = None,
    retries: int = 0,
) -> RunResult:
    """Run one stage for one rollout; returns what happened (the task turns it into its state)."""
    owner = ctx.lease_owner(task_id)
    claimed = _claim(ctx, stage, rollout_id, owner, attempt)
    if isinstance(claimed, str):
        log.info("%s of %s skipped: rollout is %s", stage, rollout_id, claimed)
        return RunResult.skipped(claimed)
    log_context.bind(job_id=claimed.rollout.job_id, attempt=claimed.rollout.attempt)
    on_lost = (lambda: _release_runtime(ctx, claimed)) if stage in RUNTIME_STAGES else None
    started = time.monotonic()
    with ctx.leases.hold(claimed, on_lost) as held:
        try:
            with allowing(ctx.settings.import_allowlist):  # the job's evaluator and builder
                outcome = STAGE_FUNCTIONS[stage](ctx, claimed)
        except Exception as exc:
            held.settle()
            if held.lost.is_set():  # taken meanwhile (its agent killed): nothing of it is kept
                return RunResult.lease_lost()
            if isinstance(exc, StageRestart):
                return _unexpected(ctx, claimed, retries, str(exc), exc.reason)
            if isinstance(exc, StageFailure):
                return _failed(ctx, claimed, exc.reason, str(exc))
            return _unexpected(ctx, claimed, retries, traceback.format_exc())
        held.settle()  # from here on a heartbeat missing the row is our own commit
        detail = {**outcome.detail(), "duration_s": round(time.monotonic() - started, 4)}
        observe_outcome(stage, detail)
        try:
            next_message = _next_message(ctx, claimed, outcome)
            record = _Record(outcome.columns(), outcome.rows(), detail)
            _finish(ctx, claimed, record, next_message)
        except LeaseLost:
            log.warning("%s of %s: lease lost, result discarded", stage, rollout_id)
            if stage in RUNTIME_STAGES:
                _release_runtime(ctx, claimed)
            return RunResult.lease_lost()
    if STAGE_STATES[stage][2] in RolloutStatus.TERMINAL:
        _release_runtime(ctx, claimed, reusable=True)
        _rollout_ended(ctx, claimed)
    return RunResult.done()


def _rollout_ended(ctx: WorkerContext, claimed: Claimed) -> None:
    """Apply the job's early-stop rule (`stop`), in its own transaction.

    Only once the rollout's terminal state is committed: that ordering is what keeps two rollouts
    of a group ending at once from both missing the stop (see `jobs.early_stop`). A failure
    here is only logged: the next rollout of the job to end repeats the check.
    """
    if claimed.spec.stop is None:
        return
    rollout = claimed.rollout
    try:
        applied = _commit(
            ctx,
            lambda session: after_rollout_ended(
                session, rollout.job_id, rollout.task_index, claimed.spec, claimed.owner
            ),
        )
    except Exception:
        log.exception("early-stop check after rollout %s failed", rollout.id)
        return
    if applied.stragglers_cancelled or applied.job_stopped:
        log.info(
            "early stop after %s: %d stragglers cancelled, job stopped: %s (%d cancelled)",
            rollout.id, len(applied.stragglers_cancelled), applied.job_stopped,
            len(applied.rollouts_cancelled),
        )  # fmt: skip


def _failed(ctx: WorkerContext, claimed: Claimed, reason: str, message: str) -> RunResult:
    """End the rollout as failed with its reason (an infrastructure failure, never scored)."""
    log.warning(
        "%s of %s failed (%s): %s", claimed.stage, claimed.rollout.id, reason, message[-500:]
    )
    try:
        _commit(ctx, lambda session: fail(session, claimed, reason, message), atomic=False)
    except LeaseLost:  # taken meanwhile (cancelled, restarted elsewhere): its end is not ours
        log.warning("%s of %s: lease lost before recording the failure", *_ids(claimed))
        if claimed.stage in RUNTIME_STAGES:
            _release_runtime(ctx, claimed)
        return RunResult.lease_lost()
    if claimed.stage in RUNTIME_STAGES:
        _release_runtime(ctx, claimed)
    _rollout_ended(ctx, claimed)
    _platform_stop(ctx, claimed, reason)
    return RunResult.failed(reason)


def _platform_stop(ctx: WorkerContext, claimed: Claimed, reason: str) -> None:
    """After a backend failure: fail the rest of the job when its attempts all fail the same
    way and none got through (`jobs.failures`). A failure here is only logged: the next failed
    attempt checks again."""
    if reason != TerminationReason.BACKEND_ERROR:
        return
    job_id = claimed.rollout.job_id
    try:
        stopped = _commit(
            ctx, lambda session: stop_on_platform_failures(session, job_id, claimed.owner)
        )
    except Exception:
        log.exception("platform-stop check of job %s failed", job_id)
        return
    if stopped:
        log.warning("job %s stopped: %d rollouts failed, its engine fails every call", job_id,
                    stopped)  # fmt: skip


def _unexpected(
    ctx: WorkerContext,
    claimed: Claimed,
    retries: int,
    error: str,
    reason: str = TerminationReason.RUNTIME_ERROR,
) -> RunResult:
    """A stage raised: retry it in place with backoff, or start the rollout over, within bounds.

    The agent stage is never retried in place (its calls and files would mix two runs): a new
    attempt starts from prepare. Other stages are idempotent and retried where they are.
    """
    stage_retries = claimed.spec.retries.stage_retries
    pool = claimed.spec.pool
    log.warning("%s of %s raised: %s", claimed.stage, claimed.rollout.id, error[-500:])
    try:
        if claimed.stage is Stage.RUN_AGENT:
            _release_runtime(ctx, claimed)
            result = _commit(
                ctx, lambda session: restart_claimed(session, claimed, pool, reason, error)
            )
            if result is Recovery.FAILED:  # attempts used up: the rollout ended
                _rollout_ended(ctx, claimed)
            if result is not Recovery.RACED:
                _platform_stop(ctx, claimed, reason)
            return RunResult.restart(result)
        if retries >= stage_retries:
            return _failed(ctx, claimed, reason, f"failed after {retries} retries: {error}")
        delay = backoff_s(retries, ctx.settings.retry_backoff_s)
        message = StageMessage(
            claimed.stage, claimed.rollout.id, pool, claimed.rollout.node,
            attempt=claimed.rollout.attempt, retries=retries + 1, countdown=delay,
            priority=claimed.spec.priority,
        )  # fmt: skip
        _commit(ctx, lambda session: retry_in_place(session, claimed, message, error, delay))
        return RunResult.retry(retries + 1)
    except LeaseLost:
        log.warning("%s of %s: lease lost while recovering", *_ids(claimed))
        return RunResult.lease_lost()


def _ids(claimed: Claimed) -> tuple[str, str]:
    return str(claimed.stage), str(claimed.rollout.id)
