"""Compare-and-set stage transitions: the fence that makes duplicated messages harmless.

`claim` moves a rollout from the stage's ready state to its busy state with a lease owner, in its
own committed transaction; only one delivery can win it. `finish` and `fail` write the stage's
result only while the same owner still holds the rollout in the busy state, so a redelivered copy,
or a worker whose lease was taken over, cannot write a second effect.

These run once per stage of every rollout, so they are single Core statements (UPDATE … RETURNING,
multi-row INSERT) rather than ORM loads and flushes; on PostgreSQL the transition and its event are
one statement (`fused`), so a claim, and a finish without rows, is one round trip in autocommit,
run on the driver's cursor with its compiled form kept (`raw_sql`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    Connection,
    CursorResult,
    Integer,
    Table,
    Text,
    Update,
    Uuid,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy import cast as cast_
from sqlalchemy.orm import Session

from polar_mq.infra.raw_sql import first_row
from polar_mq.lifecycle.fused import (
    EVENT_COLUMNS,
    MAX_FUSED_ROWS,
    RowsShape,
    fenced_update,
    finish_statement,
    lease_fence,
    row_param,
    with_event,
)
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import defer_publish
from polar_mq.lifecycle.stages import STAGE_STATES, Stage
from polar_mq.models import Event, EventKind, Job, JobTask, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.spec import JobSpec, TaskInstance, load_spec

EVENTS = cast(Table, Event.__table__)
ROLLOUTS = cast(Table, Rollout.__table__)
R = ROLLOUTS.c


class LeaseLost(RuntimeError):
    """The rollout is no longer held by this worker in this stage; its result is discarded."""


@dataclass(frozen=True, slots=True)
class RolloutRef:
    """The rollout columns a stage reads, as returned by its claim."""

    id: uuid.UUID
    job_id: uuid.UUID
    task_id: int
    task_index: int
    sample_index: int
    attempt: int
    node: str | None
    runtime_id: str | None
    agent_exit_code: int | None
    termination_reason: str | None
    created_at: datetime | None = None
    """Bounds the days its calls are read from (`polar_mq.calls`)."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A rollout won by one stage execution, with the job spec and task instance it needs."""

    rollout: RolloutRef
    spec: JobSpec
    instance: TaskInstance
    owner: str
    stage: Stage


Db = Session | Connection
"""Where a transition runs: a session's connection, or a bare connection (the runner's claim,
which spares the session's own bookkeeping on every stage)."""
SpecLoader = Callable[[Db, RolloutRef], tuple[JobSpec, TaskInstance]]
_RETURNED = [R[f.name] for f in fields(RolloutRef)]


def connection_of(db: Db) -> Connection:
    return db if isinstance(db, Connection) else db.connection()


def load_spec_and_task(db: Db, rollout: RolloutRef) -> tuple[JobSpec, TaskInstance]:
    """The typed job spec and the task instance of a rollout (both immutable once submitted)."""
    row = connection_of(db).execute(_SPEC_AND_TASK, {"b_task": rollout.task_id}).one()
    return load_spec(row.spec), TaskInstance.of(row.instance)


_SPEC_AND_TASK = (
    select(Job.spec, JobTask.instance)
    .join(JobTask, JobTask.job_id == Job.id)
    .where(JobTask.id == bindparam("b_task"))
)


_INSERT_EVENT = insert(EVENTS).values(
    {k: bindparam(k, type_=EVENTS.c[k].type) for k in EVENT_COLUMNS}
)
"""One event row, a constant statement: it runs on the driver's cursor (`raw_sql`)."""


def _claim_statement(stage: Stage) -> Update:
    """Built once per stage: rebuilding it per call costs more CPU than running it."""
    ready, busy, _ = STAGE_STATES[stage]
    values: dict[str, Any] = {
        "status": busy,
        "lease_owner": bindparam("b_owner"),
        "lease_expires_at": bindparam("b_expires"),
    }
    if stage is Stage.PREPARE:
        values["started_at"] = func.coalesce(R.started_at, bindparam("b_now"))
    return (
        update(ROLLOUTS)
        .where(
            R.id == bindparam("b_id"),
            R.status == ready,
            R.attempt == func.coalesce(bindparam("b_attempt", type_=Integer), R.attempt),
        )
        .values(**values)
        .returning(*_RETURNED)
    )


_CLAIM = {stage: _claim_statement(stage) for stage in Stage}
_CLAIM_FUSED = {
    stage: with_event(_CLAIM[stage], EVENTS, stage, EventKind.STARTED) for stage in Stage
}
_FENCED = fenced_update(ROLLOUTS)
"""SET columns come from the parameters of each call (update() without values())."""
_RENEW = fenced_update(ROLLOUTS).values(lease_expires_at=bindparam("b_expires"))
_HELD = (
    func.unnest(
        cast_(bindparam("b_ids"), ARRAY(Uuid)),
        cast_(bindparam("b_states"), ARRAY(Text)),
        cast_(bindparam("b_owners"), ARRAY(Text)),
    )
    .table_valued("id", "busy", "owner")
    .render_derived("held")
)
_RENEW_HELD = (
    update(ROLLOUTS)
    .where(lease_fence(ROLLOUTS, _HELD.c.id, _HELD.c.busy, _HELD.c.owner))
    .values(lease_expires_at=bindparam("b_expires"))
    .returning(R.id, R.status, R.lease_owner)
)
"""`_RENEW` for a whole batch in one statement (PostgreSQL): `UPDATE … FROM unnest(…)`."""


def _rowcount(result: object) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


def _event(db: Db, rollout: RolloutRef, stage: Stage, kind: str, owner: str, **detail: Any) -> None:
    first_row(
        connection_of(db),
        _INSERT_EVENT,
        {
            "job_id": rollout.job_id,
            "rollout_id": rollout.id,
            "stage": stage.value,
            "kind": kind,
            "attempt": rollout.attempt,
            "worker": owner,
            "at": utcnow(),
            "detail": detail,
        },
    )


def claim(
    db: Db,
    stage: Stage,
    rollout_id: uuid.UUID,
    owner: str,
    lease_s: float,
    load: SpecLoader = load_spec_and_task,
    attempt: int | None = None,
) -> Claimed | str:
    """Win the rollout for `stage`, or return the status that made the claim fail.

    `attempt` fences messages: one left over from an earlier attempt (a lost worker's redelivered
    message) never claims the rollout's new attempt and returns "stale_attempt".
    """
    now = utcnow()
    params: dict[str, Any] = {
        "b_id": rollout_id,
        "b_owner": owner,
        "b_expires": now + timedelta(seconds=lease_s),
        "b_attempt": attempt,
    }
    if stage is Stage.PREPARE:
        params["b_now"] = now
    conn = connection_of(db)
    fused = _fused(conn)
    row: tuple[Any, ...] | None
    if fused:  # the started event comes with the claim, in the same statement
        params.update(b_at=now, b_detail={})
        row = first_row(conn, _CLAIM_FUSED[stage], params)
    else:
        hit = conn.execute(_CLAIM[stage], params).one_or_none()
        row = None if hit is None else hit._tuple()  # Row.tuple() warns once per call
    if row is None:
        status_row = conn.execute(
            select(*_RETURNED, R.status).where(R.id == rollout_id)
        ).one_or_none()
        if status_row is None:
            return "missing"
        lost = RolloutRef(*status_row._tuple()[:-1])
        found = str(status_row.status)
        if attempt is not None and lost.attempt != attempt:
            found = "stale_attempt"
        _event(conn, lost, stage, EventKind.SKIPPED, owner, status=found, attempt=attempt)
        return found
    rollout = RolloutRef(*row)
    if not fused:
        _event(conn, rollout, stage, EventKind.STARTED, owner)
    spec, instance = load(conn, rollout)
    return Claimed(rollout, spec, instance, owner, stage)


def _fused(conn: Connection) -> bool:
    """Whether the transition and its event go in one statement (`fused`: PostgreSQL)."""
    return conn.dialect.name == "postgresql"


def _fenced_with_event(
    db: Db,
    claimed: Claimed,
    values: Mapping[str, Any],
    kind: str,
    detail: Any,
    rows: tuple[RowsShape, dict[str, Any]] = ((), {}),
) -> bool:
    """The fenced update plus its event (and `rows`, shaped by `_rows_shape`), in one statement
    where the dialect allows (True), or nothing done (False: the caller runs `_fenced_update`
    and `_event`)."""
    conn = connection_of(db)
    if not _fused(conn):
        return False
    values = {"lease_owner": None, "lease_expires_at": None, **values}
    keys = tuple(sorted(values))
    shape, row_params = rows
    statement = finish_statement(ROLLOUTS, EVENTS, claimed.stage, kind, keys, shape)
    _, busy, _ = STAGE_STATES[claimed.stage]
    params = {f"v_{key}": values[key] for key in keys}
    params.update(
        b_id=claimed.rollout.id, b_busy=busy, b_owner=claimed.owner, b_at=utcnow(),
        b_detail=detail, **row_params,
    )  # fmt: skip
    if first_row(conn, statement, params) is None:
        raise LeaseLost(f"rollout {claimed.rollout.id} left {claimed.stage} under another owner")
    return True


def _rows_shape(
    rows: Mapping[Table, list[dict[str, Any]]],
) -> tuple[RowsShape, dict[str, Any]] | None:
    """`rows` as the shape and parameters of a fused finish (`fused.with_event`), or None when
    they do not fit one: more than `MAX_FUSED_ROWS` in a table, rows of different columns, or
    a column with a Python-side default left out (only `insert(table)` applies those)."""
    shape: list[tuple[Table, int, tuple[str, ...]]] = []
    params: dict[str, Any] = {}
    for table, table_rows in rows.items():
        if not table_rows:
            continue
        columns = tuple(table_rows[0])
        if len(table_rows) > MAX_FUSED_ROWS or any(tuple(r) != columns for r in table_rows):
            return None
        if any(c.default is not None and c.name not in columns for c in table.columns):
            return None
        shape.append((table, len(table_rows), columns))
        for i, row in enumerate(table_rows):
            for column in columns:
                params[row_param(table, i, column)] = row[column]
    return tuple(shape), params


def _fenced_update(session: Session, claimed: Claimed, values: Mapping[str, Any]) -> None:
    _, busy, _ = STAGE_STATES[claimed.stage]
    params = {
        "b_id": claimed.rollout.id,
        "b_busy": busy,
        "b_owner": claimed.owner,
        "lease_owner": None,
        "lease_expires_at": None,
        **values,
    }
    done = _rowcount(session.connection().execute(_FENCED, params))
    if done != 1:
        raise LeaseLost(f"rollout {claimed.rollout.id} left {claimed.stage} under another owner")


def _finished_values(claimed: Claimed, values: dict[str, Any]) -> dict[str, Any]:
    _, _, done = STAGE_STATES[claimed.stage]
    if done in RolloutStatus.TERMINAL:
        values = {**values, "finished_at": utcnow()}
    return {"status": done, **values}


def finish(
    session: Session,
    claimed: Claimed,
    values: dict[str, Any],
    rows: Mapping[Table, list[dict[str, Any]]],
    detail: dict[str, Any],
    next_message: StageMessage | None,
) -> None:
    """Record the stage's result and hand the rollout to the next stage (after commit)."""
    values = _finished_values(claimed, values)
    if not _fenced_with_event(session, claimed, values, EventKind.FINISHED, detail):
        _fenced_update(session, claimed, values)
        _event(session, claimed.rollout, claimed.stage, EventKind.FINISHED, claimed.owner, **detail)
    for table, table_rows in rows.items():
        if table_rows:
            session.connection().execute(insert(table), table_rows)
    if next_message is not None:
        defer_publish(session, next_message)


def finish_in_one(
    conn: Connection,
    claimed: Claimed,
    values: dict[str, Any],
    rows: Mapping[Table, list[dict[str, Any]]],
    detail: dict[str, Any],
) -> bool:
    """`finish` as one statement, rows included (PostgreSQL, rows that fit `_rows_shape`): atomic
    on its own, so the runner sends it in autocommit on a bare connection and publishes the
    next stage itself once it returned. False, and nothing done, when it cannot be one."""
    shaped = _rows_shape(rows) if _fused(conn) else None
    if shaped is None:
        return False
    values = _finished_values(claimed, values)
    return _fenced_with_event(conn, claimed, values, EventKind.FINISHED, detail, shaped)


def fail(session: Session, claimed: Claimed, reason: str, error: str) -> None:
    """End the rollout as failed (an infrastructure failure: no reward)."""
    values = {
        "status": RolloutStatus.FAILED,
        "termination_reason": reason,
        "error": error[-4000:],
        "reward": None,
        "finished_at": utcnow(),
    }
    detail = {"reason": reason, "error": error[-1000:]}
    if not _fenced_with_event(session, claimed, values, EventKind.FAILED, detail):
        _fenced_update(session, claimed, values)
        _event(session, claimed.rollout, claimed.stage, EventKind.FAILED, claimed.owner, **detail)


def runtime_released(db: Db, claimed: Claimed, detail: dict[str, Any]) -> None:
    """Log how the rollout's runtime ended (recycled or destroyed, and how long it took).

    A separate event, not part of the stage's `finished` one: the runtime is released only once
    that result is committed.
    """
    _event(db, claimed.rollout, claimed.stage, EventKind.RUNTIME_RELEASED, claimed.owner, **detail)


def renew_lease(
    session: Session, rollout_id: uuid.UUID, busy: str, owner: str, expires: datetime
) -> bool:
    """Extend a stage's lease to `expires`; False when the rollout is no longer held by `owner`
    in `busy` (cancelled, restarted by the sweeper, or its own result just committed)."""
    params = {"b_id": rollout_id, "b_busy": busy, "b_owner": owner, "b_expires": expires}
    return _rowcount(session.connection().execute(_RENEW, params)) == 1


Hold = tuple[uuid.UUID, str, str]
"""A running stage's lease: its rollout, the stage's busy state, the lease owner."""


def renew_leases(session: Session, holds: Sequence[Hold], expires: datetime) -> set[Hold]:
    """Extend every lease of `holds` to `expires`; the ones extended (the others were taken from
    their owner, as in `renew_lease`).

    On PostgreSQL one statement for them all: a node with a thousand live sessions renewed them
    one UPDATE at a time, a round trip each, every `lease_s / 3`, its keeper never idle and the
    lease of the last ones at risk on a loaded machine. Elsewhere one `renew_lease` each."""
    if not holds:
        return set()
    if session.get_bind().dialect.name != "postgresql":
        return {hold for hold in holds if renew_lease(session, *hold, expires)}
    params = {
        "b_expires": expires,
        "b_ids": [rollout_id for rollout_id, _, _ in holds],
        "b_states": [busy for _, busy, _ in holds],
        "b_owners": [owner for _, _, owner in holds],
    }
    return {(row.id, row.status, row.lease_owner) for row in session.execute(_RENEW_HELD, params)}


def still_held(session: Session, holds: Mapping[uuid.UUID, tuple[str, str]]) -> set[uuid.UUID]:
    """Which rollouts of `holds` ({rollout: (busy state, owner)}) are still held that way: one
    read, for a lease keeper that looks for cancels more often than it renews (a renewal is a
    write per rollout; this is one SELECT for every stage of the process)."""
    if not holds:
        return set()
    rows = session.execute(select(R.id, R.status, R.lease_owner).where(R.id.in_(list(holds)))).all()
    return {row.id for row in rows if holds[row.id] == (row.status, row.lease_owner)}
