"""A proxy killed (SIGKILL) mid-rollout and restarted: the rollout's calls keep their order.

A real proxy process (`polar-mq proxy`, started by `polar_mq.stack.devstack`) in front of the fake
vLLM process logs to the session's PostgreSQL. A rollout's agent makes its calls one after another,
each carrying its index in the prompt. After a few calls are stored the proxy's process group is
killed with SIGKILL (nothing drains), a new proxy starts on the same port, and the agent goes on,
retrying a call the dead proxy never answered, as an agent's client does. The stored calls must
then have distinct seqs whose order is the order the agent made them in (what the trajectory
builders, the calls API and the answer fallback read).

The same with `--workers 2`, whose shared counter lives in a Redis with no persistence (as on this
machine): the Redis is restarted along with the proxy, so its counters are gone too.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.models import LlmCall
from polar_mq.stack.devstack import LocalStack
from tests.reliability.private_redis import PrivateRedis
from tests.reliability.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.reliability, pytest.mark.timeout(180)]

SECRET = "order-secret-" + uuid.uuid4().hex
ADMIN = "order-admin-" + uuid.uuid4().hex
BEFORE = 3
"""Calls stored before the kill."""
AFTER = 3
"""Calls the agent makes after the restart."""


class Agent:
    """One rollout's agent: sequential chat calls, each marked with its index in the prompt."""

    def __init__(self, url: str, rollout_id: uuid.UUID) -> None:
        token = issue_rollout_token(SECRET, rollout_id, 600, attempt=1)
        self.http = httpx.Client(
            base_url=url,
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
            verify=client_ssl_context(),
        )
        self.made = 0

    def call(self) -> None:
        """The next call, retried until a proxy answers it (a new connection each time, so a
        `--workers` proxy spreads the calls over its processes)."""
        body = {"model": "agent", "messages": [{"role": "user", "content": f"call {self.made}"}]}

        def answered() -> bool:
            try:
                response = self.http.post(
                    "/v1/chat/completions", json=body, headers={"connection": "close"}
                )
            except httpx.TransportError:
                return False  # the proxy is down or restarting
            assert response.status_code in (200, 503), response.text
            return response.status_code == 200

        wait_until(answered, 60, f"call {self.made} answered")
        self.made += 1


def _stored(factory: sessionmaker[Session], rollout_id: uuid.UUID) -> list[tuple[int, str]]:
    """(seq, the agent's call index) of the rollout's stored calls, in the readers' order."""
    with factory() as session:
        calls = session.scalars(
            select(LlmCall)
            .where(LlmCall.rollout_id == rollout_id, LlmCall.attempt == 1)
            .order_by(LlmCall.seq, LlmCall.created_at)
        ).all()
    return [(call.seq, str(call.request["messages"][0]["content"])) for call in calls]


def _flush(url: str) -> None:
    def flushed() -> bool:
        headers = {"authorization": f"Bearer {ADMIN}"}
        return httpx.post(f"{url}/admin/flush", headers=headers, timeout=30).status_code == 200

    wait_until(flushed, 60, "the proxy's calls stored")


@pytest.fixture()
def rollout_id(db_session_factory: sessionmaker[Session]) -> uuid.UUID:
    """A rollout of a new job (the proxy serves the calls of existing rollouts only)."""
    with unit_of_work(db_session_factory) as session:
        spec = {"tasks": [{"instruction": "x"}], "samples_per_task": 1}
        job = create_job(session, JobCreate.model_validate(spec), "p")
    return uuid.UUID(str(job.rollout_ids[0]))


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def _settings(pg_url: str, tmp_path: Path, upstream_port: int, **extra: Any) -> Settings:
    return Settings(
        database_url=pg_url,
        upstream_url=f"http://127.0.0.1:{upstream_port}",
        served_model="fake-model",
        proxy_port=free_port(),
        secret_key=SECRET,
        proxy_admin_token=ADMIN,
        proxy_spill_dir=tmp_path / "spill",
        **extra,
    )


def _kill_and_restart_mid_rollout(
    settings: Settings,
    tmp_path: Path,
    factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    restart_redis: PrivateRedis | None = None,
) -> list[tuple[int, str]]:
    url = settings.proxy_base_url
    upstream_port = int(settings.upstream_url.rsplit(":", 1)[1])
    with LocalStack(settings, tmp_path / "logs") as stack:
        stack.fake_upstream(upstream_port)
        first: ManagedProcess = stack.proxy()
        agent = Agent(url, rollout_id)
        for _ in range(BEFORE):
            agent.call()
        wait_until(lambda: len(_stored(factory, rollout_id)) == BEFORE, 30, "the first calls")
        first.stop(signal.SIGKILL)  # the whole process group, nothing drains
        assert not first.alive()
        if restart_redis is not None:  # no persistence: the shared counters are gone too
            restart_redis.stop()
            restart_redis.start()
        stack.proxy()
        for _ in range(AFTER):
            agent.call()
        _flush(url)
        agent.http.close()
    return _stored(factory, rollout_id)


def _check_order(stored: list[tuple[int, str]]) -> None:
    seqs = [seq for seq, _ in stored]
    assert len(set(seqs)) == len(seqs), f"duplicate seqs: {stored}"
    made = [f"call {i}" for i in range(BEFORE + AFTER)]
    assert [marker for _, marker in stored] == made, f"calls out of order: {stored}"
    assert seqs == list(range(BEFORE + AFTER)), stored  # gap-free: nothing was lost here


def test_a_killed_proxy_restarted_mid_rollout_keeps_the_call_order(
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
) -> None:
    settings = _settings(pg_url, tmp_path, free_port())
    _check_order(_kill_and_restart_mid_rollout(settings, tmp_path, db_session_factory, rollout_id))


def test_workers_and_their_redis_restarted_mid_rollout_keep_the_call_order(
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    private_redis: PrivateRedis,
) -> None:
    settings = _settings(
        pg_url, tmp_path, free_port(), proxy_workers=2, proxy_redis_url=private_redis.url
    )
    stored = _kill_and_restart_mid_rollout(
        settings, tmp_path, db_session_factory, rollout_id, private_redis
    )
    _check_order(stored)
