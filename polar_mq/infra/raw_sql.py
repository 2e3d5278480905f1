"""The one bypass of SQLAlchemy's execution: the stage transitions' own statements run on the
DBAPI cursor, compiled once.

Every stage of every rollout runs a claim and a finish (`transitions`, `fused`). Through
`Connection.execute`, SQLAlchemy's own work on each (cache-key lookup, execution context, result
wrapping) costs more CPU than the driver's (docs/benchmarks.md). These
statements are built once and never change, so their compiled SQL and bind processors are kept
here, and they run straight on the psycopg cursor of the same connection, inside the same
transaction (or in the same autocommit mode) as before.

What SQLAlchemy did on the way is done here too: bind processors (the JSON serializer of the
engine, found through public API in `_processors`), and a driver error wrapped as SQLAlchemy's
(`OperationalError` for a dropped connection, which is also invalidated, so the runner's retry
gets a fresh one). Any other driver than psycopg takes the ordinary path.
tests/infra/test_raw_sql.py runs every statement built for this path both ways and compares
the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from psycopg.pq import ExecStatus
from sqlalchemy import Connection, Insert, Select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import Compiled, SQLCompiler
from sqlalchemy.types import TupleType


@dataclass(frozen=True, slots=True)
class _Entry:
    statement: Statement
    """Held so that the `id` it is cached under is never reused by another statement."""
    dialect: Dialect
    compiled: Compiled
    sql: str
    processors: Mapping[str, Callable[[Any], Any]]
    returns_rows: bool
    """Whether the statement itself returns rows: a SELECT, or DML with RETURNING. An INSERT
    compiled for PostgreSQL returns its new primary key (SQLAlchemy's implicit RETURNING), which
    `execute` does not hand back as a row, so neither does `first_row`."""


Statement = Select[Any] | Insert
_compiled: dict[tuple[int, int], _Entry] = {}
_TUPLES_OK = ExecStatus.TUPLES_OK


def _entry(statement: Statement, dialect: Dialect) -> _Entry:
    key = (id(statement), id(dialect))
    entry = _compiled.get(key)
    if entry is None:
        compiled = statement.compile(dialect=dialect)
        entry = _Entry(
            statement, dialect, compiled, compiled.string, _processors(compiled),
            returns_rows=bool(statement.exported_columns),
        )  # fmt: skip
        _compiled[key] = entry
    return entry


def _processors(compiled: Compiled) -> dict[str, Callable[[Any], Any]]:
    """The bind processor of each parameter that has one, by the name `construct_params` gives
    it: what `execute` applies, read through public API (`SQLCompiler.bind_names` and each
    type's `dialect_impl(...).bind_processor`, which SQLAlchemy's private, cached per-compile
    map is built from). Expanding (IN lists), literal-execute and tuple parameters would need
    SQLAlchemy's own per-execution rewriting: such a statement is refused."""
    assert isinstance(compiled, SQLCompiler)
    dialect = compiled.dialect
    escaped = compiled.escaped_bind_names
    found: dict[str, Callable[[Any], Any]] = {}
    for param, name in compiled.bind_names.items():
        if param.expanding or param.literal_execute or isinstance(param.type, TupleType):
            raise ValueError(f"raw_sql cannot run parameter {name!r} (expanding, literal, tuple)")
        process = param.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            found[escaped.get(name, name)] = process
    return found


def first_row(
    conn: Connection, statement: Statement, params: Mapping[str, Any]
) -> tuple[Any, ...] | None:
    """The first row of `statement` run with `params` on `conn` (None if it returned none, or
    returns no rows: an INSERT without RETURNING).

    `statement` must be long-lived (a module constant or cached): its compiled form is kept.
    """
    if conn.dialect.driver != "psycopg":
        result = conn.execute(statement, dict(params))
        row = result.first() if result.returns_rows else None
        return None if row is None else tuple(row)
    entry = _entry(statement, conn.dialect)
    if not conn.in_transaction():
        conn.begin()  # what `execute` would do: the caller's commit or rollback then applies
    values = dict(entry.compiled.construct_params(dict(params)) or {})
    for key, process in entry.processors.items():
        if key in values:
            values[key] = process(values[key])
    raw = conn.connection.dbapi_connection
    assert raw is not None
    dbapi_error: type[Exception] = conn.dialect.loaded_dbapi.Error
    cursor = raw.cursor()
    try:
        cursor.execute(entry.sql, values)
        result = cursor.pgresult  # not `description`: it builds an object per column
        tuples = result is not None and result.status == _TUPLES_OK
        found = cursor.fetchone() if tuples and entry.returns_rows else None
    except dbapi_error as error:
        disconnected = conn.dialect.is_disconnect(cast(Any, error), raw, None)
        if disconnected:
            conn.invalidate(error)
        raise DBAPIError.instance(
            entry.sql, values, error, dbapi_error,
            connection_invalidated=disconnected, dialect=conn.dialect,
        ) from error  # fmt: skip
    finally:
        cursor.close()
    return None if found is None else tuple(found)
