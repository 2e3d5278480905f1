"""Database engine and unit-of-work helpers shared by the API, the workers and the proxy writer.

Services never commit; the unit of work does (the request dependency or the task wrapper), so a
failure anywhere in a stage rolls back everything that stage wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra import db_json


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL + busy timeout so the API, proxy and workers can share one embedded SQLite file."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; psycopg 3 for PostgreSQL, tuned SQLite for the embedded default.

    JSON goes through `db_json` on every engine, so a NUL an agent sent is stored losslessly.
    """
    kwargs.setdefault("json_serializer", db_json.dumps)
    kwargs.setdefault("json_deserializer", db_json.loads)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session committed on success and rolled back on any exception."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
