"""Security fixtures: a database of their own and a real `polar-mq api` process on it.

The API runs as a child process, configured through its environment like in production (keys in
the database, quotas in POLAR_MQ_* settings), and publishes to Redis under a queue prefix no worker
listens on, so submitted rollouts stay queued: exactly what the in-flight quota counts.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from security_support import SETTINGS_MAX_ROLLOUTS_PER_REQUEST, TENANT_QUOTAS, LiveApi, make_key
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from tests.conftest import REDIS_URL, scratch_database


@pytest.fixture(scope="session")
def security_db_url() -> Iterator[str]:
    with scratch_database("polar_mq_security") as url:
        yield url


@pytest.fixture(scope="session")
def security_engine(security_db_url: str) -> Iterator[Engine]:
    engine = create_db_engine(security_db_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def factory(security_engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(security_engine)


@pytest.fixture(scope="session")
def bootstrap_key(factory: sessionmaker[Session]) -> str:
    """An admin key made before the API starts: its authentication is on from the first request."""
    return make_key(factory, "bootstrap", "ops", "admin")


@pytest.fixture(scope="session")
def queue_prefix() -> Iterator[str]:
    prefix = f"sec{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(f"{REDIS_URL}/0")
    try:
        names = [n for n in client.scan_iter(match=f"*{prefix}*", count=1000)]
        if names:
            client.delete(*names)
    finally:
        client.close()


@pytest.fixture(scope="session")
def live_api(
    security_db_url: str,
    bootstrap_key: str,
    queue_prefix: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveApi]:
    port = free_port()
    env = {
        **os.environ,
        "POLAR_MQ_DATABASE_URL": security_db_url,
        "POLAR_MQ_BROKER_URL": f"{REDIS_URL}/0",
        "POLAR_MQ_QUEUE_PREFIX": queue_prefix,
        "POLAR_MQ_API_PORT": str(port),
        "POLAR_MQ_POOL": "security",
        # policy updates talk to no real proxy (a port nothing listens on)
        "POLAR_MQ_PROXY_ADMIN_URLS": f"http://127.0.0.1:{free_port()}",
        "POLAR_MQ_QUOTA_MAX_ROLLOUTS_PER_REQUEST": str(SETTINGS_MAX_ROLLOUTS_PER_REQUEST),
        "POLAR_MQ_TENANT_QUOTAS": json.dumps(TENANT_QUOTAS),
    }
    log_dir = tmp_path_factory.mktemp("security-api")
    proc = ManagedProcess(
        "api", [sys.executable, "-m", "polar_mq.cli", "api"], env, log_dir, fork=True
    )
    proc.start()
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(f"{base}/healthz", timeout_s=60)
        yield LiveApi(base, proc, Path(log_dir))
    finally:
        proc.stop()
