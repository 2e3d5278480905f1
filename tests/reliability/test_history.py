"""Scenario 11: 100 rollouts under a random schedule of faults; every invariant must still hold.

Faults (seeded, one every 2-4 s while rollouts are unfinished): kill -9 of the agent worker's main
process (then a fresh one is started), kill -9 of a pool child running an agent, a broker restart
that loses every queued message, and duplicated stage messages.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.dispatch.celery_app import create_celery, publish_messages
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.stages import STAGE_STATES, Stage
from polar_mq.models import Rollout, RolloutStatus
from tests.reliability.support import RelStack, all_terminal, check_invariants, rel_stack
from tests.reliability.test_broker_faults import PrivateRedis

pytestmark = [pytest.mark.e2e, pytest.mark.reliability, pytest.mark.slow]
READY = {ready: stage for stage, (ready, _, _) in STAGE_STATES.items()}
SEED = int(os.environ.get("POLAR_MQ_HISTORY_SEED", "20261202"))


def _kill_main(rel: RelStack, rng: random.Random) -> str:
    try:
        os.kill(rel.worker_main(Stage.RUN_AGENT).pid, signal.SIGKILL)
    except psutil.Error:
        return "kill -9 worker main (restarting)"
    return "kill -9 worker main"


def _has_children(process: psutil.Process) -> bool:
    """A pool child that runs an agent; one that exited since it was listed runs none."""
    try:
        return bool(process.children(recursive=True))
    except psutil.Error:
        return False


def _kill_child(rel: RelStack, rng: random.Random) -> str:
    try:
        children = rel.worker_main(Stage.RUN_AGENT, timeout_s=5).children()
    except (psutil.Error, AssertionError):
        return "kill -9 pool child (no worker)"
    busy = [c for c in children if _has_children(c)]
    if not busy:
        return "kill -9 pool child (none busy)"
    rng.choice(busy).kill()
    return "kill -9 pool child"


def _duplicate(rel: RelStack, factory: sessionmaker[Session], rng: random.Random) -> str:
    with factory() as session:
        rows = session.execute(
            select(Rollout.id, Rollout.status, Rollout.attempt, Rollout.node).where(
                Rollout.status.in_(list(READY))
            )
        ).all()
    if not rows:
        return "duplicate (nothing ready)"
    picked = rng.sample(rows, min(5, len(rows)))
    messages = [
        StageMessage(READY[r.status], r.id, rel.settings.pool, r.node, r.attempt) for r in picked
    ]
    publish_messages(create_celery(rel.settings), messages * 2)
    return f"duplicate x{len(messages)}"


@pytest.mark.timeout(900)
def test_history_of_random_faults(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    rng = random.Random(SEED)
    redis = PrivateRedis(tmp_path / "redis")
    redis.start()
    try:
        with rel_stack(pg_url, tmp_path, broker_url=redis.url, workers=False) as rel:
            rel.start_workers(Stage.PREPARE, Stage.BUILD, Stage.EVALUATE)
            rel.start_workers(Stage.RUN_AGENT, pool_impl="prefork")
            tasks = [{"instruction": f"task {i}", "calls": 2, "sleep_s": 1} for i in range(10)]
            ids = rel.submit(tasks, samples=10, retries={"max_attempts": 6})
            faults: list[str] = []
            started = time.monotonic()
            while not all_terminal(db_session_factory, ids):
                assert time.monotonic() - started < 600, f"not done after faults {faults}"
                time.sleep(rng.uniform(2.0, 4.0))
                if len(faults) >= 12:
                    continue  # enough chaos: let the system converge
                kind = rng.choice(["main", "child", "broker", "duplicate"])
                if kind == "main":
                    faults.append(_kill_main(rel, rng))
                elif kind == "child":
                    faults.append(_kill_child(rel, rng))
                elif kind == "broker":
                    redis.stop()
                    time.sleep(1)
                    redis.start()
                    faults.append("broker restart")
                else:
                    faults.append(_duplicate(rel, db_session_factory, rng))
            took_s = time.monotonic() - started
            rollouts = check_invariants(rel, db_session_factory, ids, leftover_timeout_s=30)
            outcome = Counter(r.status for r in rollouts.values())
            attempts = Counter(r.attempt for r in rollouts.values())
            print(
                f"\nhistory (seed {SEED}): {len(ids)} rollouts in {took_s:.0f} s under "
                f"{faults}; outcome {dict(outcome)}, attempts {dict(attempts)}"
            )
            lost = [r for r in rollouts.values() if r.status != RolloutStatus.COMPLETED]
            assert all(r.termination_reason == "worker_lost" for r in lost), [
                (str(r.id), r.status, r.termination_reason, r.error) for r in lost
            ]
            assert outcome[RolloutStatus.COMPLETED] >= 90
    finally:
        redis.stop()
