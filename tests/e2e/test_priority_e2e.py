"""Job priorities end to end: a high-priority job overtakes a low-priority backlog on Redis.

One prepare slot and a prepare recipe that takes a while make a backlog of waiting prepare
messages; a job submitted after it with a higher priority must be prepared before most of that
backlog. Real Redis, real worker processes, the order read back from PostgreSQL's events.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Rollout
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack

pytestmark = pytest.mark.e2e

N_LOW = 24
N_HIGH = 4
MAY_START_FIRST = 8
"""Low-priority rollouts allowed to start before the last high-priority one: the few the prepare
worker takes while the second job is still being submitted, with a wide margin (one prepare takes
≥ 0.3 s, a submission a few ms), so the check holds on a slow machine too."""
JOB: dict[str, Any] = {
    "harness": {"type": "command", "command": "true"},
    "runtime": {"prepare": {"commands": ["sleep 0.3"]}},
    "evaluator": "completed",
    "timeouts": {"agent_s": 60},
}


@pytest.fixture(scope="module")
def one_prepare_slot(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp: Path = tmp_path_factory.mktemp("e2e-priority")
    with fake_upstream_stack(pg_url, tmp, concurrency={Stage.PREPARE: 1}) as stack:
        yield stack


def _prepare_starts(factory: sessionmaker[Session], job_id: uuid.UUID) -> list[datetime]:
    with factory() as session:
        return list(
            session.scalars(
                select(Event.at)
                .join(Rollout, Rollout.id == Event.rollout_id)
                .where(
                    Rollout.job_id == job_id,
                    Event.stage == Stage.PREPARE.value,
                    Event.kind == EventKind.STARTED,
                )
                .order_by(Event.at)
            )
        )


def test_a_high_priority_job_is_prepared_before_a_low_priority_backlog(
    one_prepare_slot: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    client = client_of(one_prepare_slot)
    low = client.submit([{"instruction": f"low {i}"} for i in range(N_LOW)], **JOB)
    high = client.submit([{"instruction": f"high {i}"} for i in range(N_HIGH)], priority=9, **JOB)
    for job, n in ((high, N_HIGH), (low, N_LOW)):
        status = client.wait(str(job.job_id), progress=False, timeout=240)
        assert status["by_status"] == {"completed": n}, status
    assert client.status(str(high.job_id))["priority"] == 9

    low_starts = _prepare_starts(db_session_factory, low.job_id)
    high_starts = _prepare_starts(db_session_factory, high.job_id)
    assert (len(low_starts), len(high_starts)) == (N_LOW, N_HIGH)
    before = sum(1 for at in low_starts if at < max(high_starts))
    assert before <= MAY_START_FIRST, (
        f"{before} of {N_LOW} low-priority rollouts were prepared before the last "
        f"high-priority one (low starts {low_starts}, high starts {high_starts})"
    )
