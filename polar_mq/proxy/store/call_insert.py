"""The batch INSERT of `llm_calls` rows: one statement per batch, idempotent on replay.

On PostgreSQL a batch is one `INSERT ... SELECT FROM unnest(<one array per column>)`: the query
text never changes (psycopg parses and caches it once, where a VALUES list of 256 rows x 19 columns
would be re-parsed on every batch) and psycopg adapts the column arrays in C. Token lists are packed
here, exactly as the model's `PackedInt32`/`PackedFloat32` columns pack them. Other databases (the
embedded SQLite default) use SQLAlchemy's executemany ("insertmanyvalues") on the model table.
`ON CONFLICT DO NOTHING` makes a batch replayed after an ambiguous failure harmless. It names no
key: on PostgreSQL the key is (id, created_at) since `llm_calls` is partitioned by `created_at`
(migration 0009) and (id) before it, and a replayed row carries the `created_at` it was built with.
"""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from polar_mq.infra import db_json
from polar_mq.models.base import pack_float32, pack_int32
from polar_mq.models.llm_call import LlmCall

PG_ARRAY_TYPES = {
    "id": "uuid",
    "rollout_id": "uuid",
    "seq": "int4",
    "backend": "text",
    "model": "text",
    "api_type": "text",
    "stream": "bool",
    "policy_version": "int4",
    "status_code": "int4",
    "complete": "bool",
    "request": "text",
    "engine_request": "text",
    "response": "text",
    "prompt_ids": "bytea",
    "completion_ids": "bytea",
    "logprobs": "bytea",
    "finish_reason": "text",
    "latency_ms": "float8",
    "ttft_ms": "float8",
    "created_at": "timestamptz",
    "purpose": "text",
    "attempt": "int4",
    "prompt_source": "text",
    "tito_fallback": "text",
}
"""Every `llm_calls` column and the array type it travels in (a test keeps it in sync)."""

_JSON_COLUMNS = ("request", "engine_request", "response")
_MISSING: dict[str, Any] = {
    "purpose": "agent",
    "attempt": 1,
    "engine_request": None,
    "prompt_source": "chat",
    "tito_fallback": None,
}
"""Values of columns a row may lack (rows spilled by an older proxy, before the column existed)."""
_PACKERS = {"prompt_ids": pack_int32, "completion_ids": pack_int32, "logprobs": pack_float32}
_YIELD_EVERY = 64
"""Rows packed between GIL releases, so the event loop never waits a whole switch interval."""


def _pg_sql() -> str:
    names = list(PG_ARRAY_TYPES)
    select = ", ".join(f"{n}::jsonb" if n in _JSON_COLUMNS else n for n in names)
    arrays = ", ".join(f"%({n})b::{t}[]" for n, t in PG_ARRAY_TYPES.items())
    return (
        f"INSERT INTO llm_calls ({', '.join(names)}) SELECT {select} "
        f"FROM unnest({arrays}) AS t({', '.join(names)}) ON CONFLICT DO NOTHING"
    )


PG_INSERT_SQL = _pg_sql()


_TEXT_COLUMNS = (
    "backend", "model", "api_type", "finish_reason", "purpose", "prompt_source", "tito_fallback"
)  # fmt: skip


def _json_or_none(value: Any) -> str | None:
    """JSON text PostgreSQL accepts: `jsonb` refuses the NUL character (`\\u0000`), which an
    agent's prompt or an engine's answer may hold, so it is escaped losslessly (`db_json`, the
    scheme every engine's JSON deserializer undoes on read)."""
    return None if value is None else db_json.dumps(value)


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL either (e.g. in a model name an agent sent): these short
    label columns get U+FFFD; the agent's exact text stays in the `request` JSON."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value


def pg_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows -> one list per column, JSON serialized and token lists packed.

    Built column by column (one comprehension each, so no per-value branching on the column),
    `_YIELD_EVERY` rows at a time with a GIL release in between.
    """
    columns: dict[str, list[Any]] = {name: [] for name in PG_ARRAY_TYPES}
    for start in range(0, len(rows), _YIELD_EVERY):
        if start:
            time.sleep(0)
        chunk = rows[start : start + _YIELD_EVERY]
        for name, values in columns.items():
            default = _MISSING.get(name)
            if name in _JSON_COLUMNS:
                values += [_json_or_none(row.get(name, default)) for row in chunk]
            elif name in _TEXT_COLUMNS:
                values += [_text(row.get(name, default)) for row in chunk]
            elif name in _PACKERS:
                pack = _PACKERS[name]
                values += [None if (v := row.get(name)) is None else pack(v) for row in chunk]
            else:
                values += [row.get(name, default) for row in chunk]
    return columns


class CallInserter:
    """Inserts batches of call rows with the fastest statement the database supports."""

    def __init__(self, engine: Engine) -> None:
        self.dialect = engine.dialect.name
        table = cast(Table, LlmCall.__table__)
        if self.dialect == "sqlite":
            self._core: Any = sqlite_insert(table).on_conflict_do_nothing(index_elements=["id"])
        elif self.dialect == "postgresql":
            self._core = pg_insert(table).on_conflict_do_nothing()
        else:
            self._core = table.insert()

    def insert(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if self.dialect == "postgresql":
            conn.exec_driver_sql(PG_INSERT_SQL, pg_columns(rows))
        else:
            conn.execute(self._core, rows)
