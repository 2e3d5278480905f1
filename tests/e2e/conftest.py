"""The end-to-end stack: real PostgreSQL, real Redis, real worker/proxy/API processes.

Every process is a real subprocess started through `polar_mq.devstack` (the same code path as
`polar-mq demo`), configured through environment variables only; queues carry a per-session prefix
so concurrent runs on one Redis never see each other's messages.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_mq.config import Settings
from polar_mq.devstack import LocalStack, free_port

REDIS_E2E_URL = "redis://127.0.0.1:6379/3"


def e2e_settings(pg_url: str, tmp: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": pg_url,
        "broker_url": REDIS_E2E_URL,
        "queue_prefix": f"e2e{uuid.uuid4().hex[:8]}",
        "node_name": "e2e-node",
        "pool": "e2e",
        "proxy_port": free_port(),
        "api_port": free_port(),
        "runtime_root": tmp / "runtimes",
        "secret_key": "e2e-secret-" + uuid.uuid4().hex,
        "visibility_timeout_s": 7200,
        "max_agent_timeout_s": 600,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def fake_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Fake vLLM-shaped upstream + proxy + one worker process per stage + API."""
    tmp = tmp_path_factory.mktemp("e2e-fake")
    upstream_port = free_port()
    settings = e2e_settings(
        pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream_port}", served_model="fake-model"
    )
    with LocalStack(settings, tmp / "logs") as stack:
        stack.fake_upstream(upstream_port)
        stack.proxy()
        stack.workers()
        stack.api()
        yield stack
