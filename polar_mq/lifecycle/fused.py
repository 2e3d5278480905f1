"""A stage transition and its event in one PostgreSQL statement (a data-modifying CTE).

The claim (`UPDATE … RETURNING` plus its `started` event) and the finish (the fenced `UPDATE` plus
its `finished` event) each cost one round trip instead of two: the event is inserted from the
UPDATE's own result, so it exists exactly when the transition happened (no row matched: no
event), in the same statement and therefore atomically even outside a transaction. That is what
lets the runner send a claim or a row-less finish in autocommit mode, one round trip in all.

PostgreSQL only (SQLite has no data-modifying CTEs): `transitions` keeps the two-statement form
for other dialects. Statements are built once per shape and reused (SQLAlchemy caches their
compiled form by structure, but building them costs more CPU than running them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Table, Update, bindparam, insert, literal, select, update

from polar_mq.lifecycle.stages import Stage

_EVENT_COLUMNS = ["job_id", "rollout_id", "stage", "kind", "attempt", "worker", "at", "detail"]
_finish_cache: dict[tuple[Stage, str, tuple[str, ...]], Select[Any]] = {}


def with_event(dml: Update, events: Table, stage: Stage, kind: str) -> Select[Any]:
    """`dml` (an UPDATE returning the rollout's `id`, `job_id` and `attempt`) with one event per
    updated row inserted from its result; parameters `b_owner`, `b_at` and `b_detail`."""
    done = dml.cte("done")
    event = insert(events).from_select(
        _EVENT_COLUMNS,
        select(
            done.c.job_id,
            done.c.id,
            literal(stage.value),
            literal(kind),
            done.c.attempt,
            bindparam("b_owner"),
            bindparam("b_at", type_=events.c.at.type),
            bindparam("b_detail", type_=events.c.detail.type),
        ),
    )
    return select(done).add_cte(event.cte("event"))


def fenced_update(rollouts: Table) -> Update:
    """An UPDATE of the rollout that still holds the lease: `b_id` in stage status `b_busy`,
    leased by `b_owner` (a worker that lost its lease updates nothing)."""
    r = rollouts.c
    return update(rollouts).where(
        r.id == bindparam("b_id"),
        r.status == bindparam("b_busy"),
        r.lease_owner == bindparam("b_owner"),
    )


def finish_statement(
    rollouts: Table, events: Table, stage: Stage, kind: str, keys: tuple[str, ...]
) -> Select[Any]:
    """The fenced UPDATE setting `keys` (parameters `v_<key>`) plus its event, built once per
    stage and set of columns, fenced by `fenced_update`."""
    cache_key = (stage, kind, keys)
    statement = _finish_cache.get(cache_key)
    if statement is None:
        r = rollouts.c
        dml = (
            fenced_update(rollouts)
            .values({key: bindparam(f"v_{key}", type_=r[key].type) for key in keys})
            .returning(r.id, r.job_id, r.attempt)
        )
        statement = with_event(dml, events, stage, kind)
        _finish_cache[cache_key] = statement
    return statement
