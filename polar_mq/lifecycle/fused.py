"""A stage transition and its event in one PostgreSQL statement (a data-modifying CTE).

The claim (`UPDATE … RETURNING` plus its `started` event) and the finish (the fenced `UPDATE` plus
its `finished` event) each cost one round trip instead of two: the event is inserted from the
UPDATE's own result, so it exists exactly when the transition happened (no row matched: no
event), in the same statement and therefore atomically even outside a transaction. That is what
lets the runner send a claim or a row-less finish in autocommit mode, one round trip in all.

A finish that inserts rows (the trajectory samples of build, the evaluation of evaluate, the
artifacts of run agent) inserts them in the same statement too, each row selected `FROM` the
UPDATE's result: rows exist exactly when the transition happened, with no BEGIN, separate INSERT
and COMMIT round trips around it. Such a statement's shape depends on how many rows it carries,
so it is built (and cached) per number of rows, up to `MAX_FUSED_ROWS`; more rows take the
transaction.

PostgreSQL only (SQLite has no data-modifying CTEs): `transitions` keeps the two-statement form
for other dialects. Statements are built once per shape and reused (SQLAlchemy caches their
compiled form by structure, but building them costs more CPU than running them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    cast,
    insert,
    literal,
    select,
    union_all,
    update,
)

from polar_mq.lifecycle.stages import Stage

EVENT_COLUMNS = ("job_id", "rollout_id", "stage", "kind", "attempt", "worker", "at", "detail")
"""The columns of an event row a transition writes, in the order both forms fill them: here from
the UPDATE's result, in `transitions` from parameters of the same names."""
MAX_FUSED_ROWS = 32
"""Rows one fused finish carries at most (a statement shape is cached per count)."""
RowsShape = tuple[tuple[Table, int, tuple[str, ...]], ...]
"""Per table inserted with a finish: the table, its number of rows and their columns."""
_finish_cache: dict[tuple[Stage, str, tuple[str, ...], tuple[Any, ...]], Select[Any]] = {}


def row_param(table: Table, index: int, column: str) -> str:
    """The parameter of one value of a row a fused finish inserts."""
    return f"r_{table.name}_{index}_{column}"


def _rows_insert(done: CTE, table: Table, count: int, columns: tuple[str, ...]) -> CTE:
    """INSERT `count` rows into `table`, each one only if `done` returned a row. Every value is
    cast to its column's type: an untyped parameter (a NULL) would be taken for text."""
    selects = [
        select(
            *(
                cast(bindparam(row_param(table, i, c), type_=table.c[c].type), table.c[c].type)
                for c in columns
            )
        ).select_from(done)
        for i in range(count)
    ]
    rows = selects[0] if count == 1 else union_all(*selects)
    into = insert(table).from_select(list(columns), rows, include_defaults=False)
    return into.cte(f"rows_{table.name}")


def with_event(
    dml: Update, events: Table, stage: Stage, kind: str, rows: RowsShape = ()
) -> Select[Any]:
    """`dml` (an UPDATE returning the rollout's `id`, `job_id` and `attempt`) with one event per
    updated row inserted from its result; parameters `b_owner`, `b_at` and `b_detail`; and the
    rows of `rows` (parameters `row_param`), inserted only if the UPDATE matched."""
    done = dml.cte("done")
    event = insert(events).from_select(
        list(EVENT_COLUMNS),
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
    statement = select(done).add_cte(event.cte("event"))
    for table, count, columns in rows:
        statement = statement.add_cte(_rows_insert(done, table, count, columns))
    return statement


def lease_fence(
    rollouts: Table,
    rollout_id: ColumnElement[Any],
    busy: ColumnElement[Any],
    owner: ColumnElement[Any],
) -> ColumnElement[bool]:
    """The fence of every write a stage makes to its rollout while it runs: this rollout, still in
    the stage's busy state, leased by this owner. One definition for the single statements
    (`fenced_update`, parameters) and the lease keeper's batch renewal (`transitions`, the
    columns of an `unnest`), so the two can never fence differently."""
    r = rollouts.c
    return and_(r.id == rollout_id, r.status == busy, r.lease_owner == owner)


def fenced_update(rollouts: Table) -> Update:
    """An UPDATE of the rollout that still holds the lease: `b_id` in stage status `b_busy`,
    leased by `b_owner` (a worker that lost its lease updates nothing)."""
    fence = lease_fence(rollouts, bindparam("b_id"), bindparam("b_busy"), bindparam("b_owner"))
    return update(rollouts).where(fence)


def finish_statement(
    rollouts: Table,
    events: Table,
    stage: Stage,
    kind: str,
    keys: tuple[str, ...],
    rows: RowsShape = (),
) -> Select[Any]:
    """The fenced UPDATE setting `keys` (parameters `v_<key>`) plus its event and `rows`, built
    once per stage, set of columns and rows' shape, fenced by `fenced_update`."""
    cache_key = (stage, kind, keys, tuple((t.name, n, cols) for t, n, cols in rows))
    statement = _finish_cache.get(cache_key)
    if statement is None:
        r = rollouts.c
        dml = (
            fenced_update(rollouts)
            .values({key: bindparam(f"v_{key}", type_=r[key].type) for key in keys})
            .returning(r.id, r.job_id, r.attempt)
        )
        statement = with_event(dml, events, stage, kind, rows)
        _finish_cache[cache_key] = statement
    return statement
