"""The bench's own PostgreSQL database and Redis keys (created for one run, removed after it),
and the settings of a local stack on them (shared by every bench that starts one)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import text

from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.migrate import upgrade
from polar_mq.infra.ports import free_port


def stack_settings(
    tag: str, db_url: str, redis_url: str, tmp: Path, upstream: int, **extra: Any
) -> Settings:
    """One run's stack: own queues (prefix `bench<tag>`), ports, runtime root and secret, a fake
    vLLM-shaped upstream on port `upstream`; `extra` overrides any setting."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "broker_url": redis_url,
        "queue_prefix": f"bench{tag}",
        "pool": "bench",
        "node_name": f"bench-{tag}",
        "proxy_port": free_port(),
        "api_port": free_port(),
        "upstream_url": f"http://127.0.0.1:{upstream}",
        "served_model": "fake-model",
        "runtime_root": tmp / "runtimes",
        "secret_key": f"bench-secret-{uuid.uuid4().hex}",
        "visibility_timeout_s": 7200,
        "max_agent_timeout_s": 600,
        # the bench's own trivial agent, below a private mkdtemp directory: run as the bench's user
        "unsafe_root_agents": True,
        **extra,
    }
    return Settings(**values)


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
