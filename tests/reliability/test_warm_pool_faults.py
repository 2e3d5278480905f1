"""A worker killed with -9 while its rollouts hold warm-pool runtimes leaves nothing behind."""

from __future__ import annotations

import os
import signal
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind
from polar_mq.runtimes.warm_pool import WarmPool, is_pooled
from tests.reliability.support import (
    RelStack,
    agent_seen_calls,
    check_invariants,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]
SLOW = {"instruction": "slow", "sleep_s": 4}
WARM = {"kind": "local", "warm": True, "reuse": True, "prepare": {"commands": ["true"]}}


def _prepared_runtimes(factory: sessionmaker[Session], ids: list[str]) -> dict[int, set[str]]:
    """Runtime ids the prepares recorded, per attempt."""
    found: dict[int, set[str]] = {}
    with factory() as session:
        for attempt, detail in session.execute(
            select(Event.attempt, Event.detail).where(
                Event.rollout_id.in_([uuid.UUID(i) for i in ids]),
                Event.stage == "prepare",
                Event.kind == EventKind.FINISHED,
            )
        ):
            found.setdefault(attempt, set()).add(detail["runtime_id"])
    return found


def test_kill9_agent_worker_holding_warm_runtimes(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    ids = rel.submit([SLOW], samples=2, runtime=WARM)
    wait_until(
        lambda: len({rid for rid, _ in agent_seen_calls(rel.call_log)}) >= 2, 60, "two agents"
    )
    worker = rel.worker_main(Stage.RUN_AGENT)
    os.kill(worker.pid, signal.SIGKILL)  # its agents live on, holding their pooled runtimes
    wait_terminal(db_session_factory, ids, 90)
    runtimes = _prepared_runtimes(db_session_factory, ids)
    assert all(is_pooled(r) for ids_ in runtimes.values() for r in ids_)
    lost = runtimes[1]
    root = rel.settings.runtime_root
    pool = WarmPool(root)
    # the attempt-1 runtimes are held by an attempt that no longer exists: the janitor's
    wait_until(
        lambda: not any((root / r).exists() for r in lost), 30, "the lost attempt's runtimes gone"
    )
    states = {m.runtime_id: m.state for m in pool.markers()}
    assert not lost & set(states), states
    # attempt 2's runtimes are recycled just after their results commit (the rollouts are
    # terminal a moment before): idle within a bound
    wait_until(
        lambda: {m.state for m in pool.markers()} <= {"idle"}, 15, "attempt 2's runtimes idle"
    )
    pool.reap_idle(-1)  # what a graceful stop of the refiller does
    rollouts = check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
    assert {r.attempt for r in rollouts.values()} == {2}
