"""Fixtures of the fault-injection suite: one fresh stack per scenario (faults are destructive)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.reliability.private_redis import PrivateRedis
from tests.reliability.support import RelStack, rel_stack


@pytest.fixture()
def rel(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> Iterator[RelStack]:
    """A full stack with small recovery timeouts; torn down before the tables are emptied."""
    with rel_stack(pg_url, tmp_path) as stack:
        yield stack


@pytest.fixture()
def pool(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> Iterator[RelStack]:
    """The stack without workers: the test starts its nodes itself."""
    with rel_stack(pg_url, tmp_path, workers=False) as stack:
        yield stack


@pytest.fixture()
def redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A broker of the scenario's own (see private_redis.py for why)."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()
