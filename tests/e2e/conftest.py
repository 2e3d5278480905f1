"""The end-to-end stack: real PostgreSQL, real Redis, real worker/proxy/API processes.

Every process is a real subprocess started through `polar_mq.stack.devstack` (the same code path as
`polar-mq demo`), configured through environment variables only; queues carry a per-session prefix
so concurrent runs on one Redis never see each other's messages.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import PolicyState
from polar_mq.stack.devstack import LocalStack
from tests.e2e.preset_support import PresetStack
from tests.e2e.stack import fake_upstream_stack


@pytest.fixture(scope="session")
def fake_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Fake vLLM-shaped upstream + proxy + one worker process per stage + API: one per test
    process, shared by every module that asks for it (none changes the stack's settings or
    stops its processes; the tables are emptied after each test). A start costs ~7 CPU-s."""
    with fake_upstream_stack(pg_url, tmp_path_factory.mktemp("e2e-fake")) as stack:
        yield stack


@pytest.fixture()
def fresh_policy(db_session_factory: sessionmaker[Session]) -> Iterator[None]:
    """Policy version 0, not paused, before and after: the policy state lives in the session's
    database and every proxy follows it, so a test that moves it must put it back."""
    with db_session_factory.begin() as session:
        session.execute(delete(PolicyState))
    yield
    with db_session_factory.begin() as session:
        session.execute(delete(PolicyState))


@pytest.fixture(scope="session")
def preset_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PresetStack]:
    """One stack for every harness test: the fake engine follows per-task plans from a directory
    (`[[plan:NAME]]` in the instruction) and accepts the long prompts real harnesses send."""
    tmp = tmp_path_factory.mktemp("e2e-presets")
    plans = tmp / "plans"
    plans.mkdir()
    latency = {"script": str(plans), "max_model_len": 2_000_000}
    with fake_upstream_stack(pg_url, tmp, latency=latency) as stack:
        yield PresetStack(stack, plans)
