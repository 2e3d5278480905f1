"""The call writer's one database connection, made for a writer that must never hang a request.

On PostgreSQL in autocommit: a batch is one statement (`call_insert`), atomic on its own, so a
BEGIN and COMMIT around it buy nothing. No pre-ping (a `SELECT 1` round trip before every batch
of one to three calls, seen in py-spy profiles): a connection that died meanwhile fails the
insert before anything is sent, and the store's retry sends the batch again on a fresh one
(`ON CONFLICT DO NOTHING` either way).
"""

from __future__ import annotations

from sqlalchemy import Engine

from polar_mq.infra.db import create_db_engine

PG_CONNECT_ARGS = {"connect_timeout": 5, "keepalives_idle": 5, "keepalives_interval": 2}
"""An unreachable database must fail a write in seconds (then rows spill), never hang it."""


def create_writer_engine(url: str) -> Engine:
    """One connection, no overflow; autocommit and bounded connects on PostgreSQL."""
    postgres = url.startswith("postgresql")
    return create_db_engine(
        url,
        pool_size=1,
        max_overflow=0,
        pool_pre_ping=False,
        **({"connect_args": PG_CONNECT_ARGS, "isolation_level": "AUTOCOMMIT"} if postgres else {}),
    )
