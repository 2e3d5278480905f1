"""Scenarios 5 and 6: the broker restarted under load, and down at submit time.

Each test runs its own `redis-server` (no persistence, like this machine's) on a free port, so
restarting it loses every queued message, which is the hard case: the sweeper must re-send them.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import Event, EventKind, Job, Rollout
from tests.conftest import module_database
from tests.reliability.private_redis import PrivateRedis
from tests.reliability.support import (
    RelStack,
    agent_seen_calls,
    check_invariants,
    rel_stack,
    wait_terminal,
    wait_until,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.reliability,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

# it counts every job and rollout: another module's stack on this xdist worker leaves rows in the
# session database
pg_url, pg_engine = module_database("polar_mq_broker_faults")


def _submit_status(rel: RelStack, n: int) -> httpx.Response:
    s = rel.settings
    body = {
        "tasks": [{"instruction": f"t{i}", "calls": 1} for i in range(n)],
        "harness": {"type": "command", "command": "true"},
    }
    return httpx.post(f"http://{s.api_host}:{s.api_port}/v1/jobs", json=body, timeout=30)


def test_broker_restart_with_rollouts_queued_and_running(
    redis: PrivateRedis, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    with rel_stack(pg_url, tmp_path, broker_url=redis.url) as rel:
        ids = rel.submit([{"instruction": "x", "sleep_s": 3}], samples=12)
        wait_until(lambda: len(agent_seen_calls(rel.call_log)) >= 4, 60, "agents running")
        redis.stop()
        down = time.monotonic()
        time.sleep(2)
        redis.start()
        resumed_s = wait_until(
            lambda: _started_since(db_session_factory, down) > 0, 60,
            "a worker to claim a stage after the restart",
        )  # fmt: skip
        wait_terminal(db_session_factory, ids, 120)
        total_s = time.monotonic() - down
        check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
        republished = _count(db_session_factory, EventKind.REPUBLISHED)
        print(
            f"\nbroker restart: workers consumed again {resumed_s:.1f} s after it was down, "
            f"all 12 done {total_s:.1f} s after; {republished} lost messages re-sent"
        )
        assert resumed_s < 30


def test_broker_down_at_submit(
    redis: PrivateRedis, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    with rel_stack(pg_url, tmp_path, broker_url=redis.url) as rel:
        redis.stop()
        refused = _submit_status(rel, 3)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "unavailable"
        assert "Retry-After" in refused.headers
        with db_session_factory() as session:
            assert session.scalar(select(func.count()).select_from(Job)) == 0
            assert session.scalar(select(func.count()).select_from(Rollout)) == 0
        redis.start()
        accepted = wait_until(lambda: _submit_status(rel, 3).status_code == 201, 30, "a 201")
        ids = [str(r) for r in db_rollouts(db_session_factory)]
        assert len(ids) == 3
        wait_terminal(db_session_factory, ids, 90)
        check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
        print(f"\nbroker down at submit: 503, then accepted {accepted:.1f} s after it came back")


def db_rollouts(factory: sessionmaker[Session]) -> list[object]:
    with factory() as session:
        return list(session.scalars(select(Rollout.id)))


def _started_since(factory: sessionmaker[Session], since_monotonic: float) -> int:
    from datetime import timedelta

    from polar_mq.models.base import utcnow

    since = utcnow() - timedelta(seconds=time.monotonic() - since_monotonic)
    with factory() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(Event)
                .where(Event.kind == EventKind.STARTED, Event.at > since)
            )
            or 0
        )


def _count(factory: sessionmaker[Session], kind: str) -> int:
    with factory() as session:
        return int(
            session.scalar(select(func.count()).select_from(Event).where(Event.kind == kind)) or 0
        )
