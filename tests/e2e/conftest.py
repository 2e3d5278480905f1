"""The end-to-end stack: real PostgreSQL, real Redis, real worker/proxy/API processes.

Every process is a real subprocess started through `polar_mq.devstack` (the same code path as
`polar-mq demo`), configured through environment variables only; queues carry a per-session prefix
so concurrent runs on one Redis never see each other's messages.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polar_mq.devstack import LocalStack
from polar_mq.processes import free_port
from tests.e2e.stack import e2e_settings


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
