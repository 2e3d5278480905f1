"""The bench's own PostgreSQL database and Redis keys: created for one run, removed after it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import redis
from sqlalchemy import text

from polar_mq.db import create_db_engine
from polar_mq.migrate import upgrade


def database_url(admin_url: str, name: str) -> str:
    return admin_url.rsplit("/", 1)[0] + "/" + name


@contextlib.contextmanager
def fresh_database(admin_url: str, prefix: str = "polar_mq_bench") -> Iterator[tuple[str, str]]:
    """A new database with the migrations applied: yields (url, name); dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_db_engine(admin_url, isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = database_url(admin_url, name)
            upgrade(url)
            yield url, name
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def cleanup_redis(url: str, tag: str) -> int:
    """Delete this run's keys (queues, counters) and its kombu binding entries; returns keys."""
    client = redis.Redis.from_url(url)
    removed = 0
    try:
        for key in list(client.scan_iter(match=f"*{tag}*", count=1000)):
            removed += int(client.delete(key))
        for key in list(client.scan_iter(match="_kombu.binding.*", count=1000)):
            with contextlib.suppress(redis.ResponseError):  # not a set: not kombu's
                members = [m for m in client.smembers(key) if tag.encode() in m]
                if members:
                    client.srem(key, *members)
    finally:
        client.close()
    return removed
