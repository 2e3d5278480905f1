"""Prepare admission with real processes: two nodes of one pool on real PostgreSQL and Redis, one
with a single run-agent slot and one with four, and agents slow enough that the small node cannot
start what it prepares at once.

Without admission both nodes' prepare workers take from the pool-wide queue at the same pace, so
the small node pins about half the rollouts to itself and they wait for its one slot while the
big node idles. With it, the small node holds at most its window (1, its run-agent concurrency)
of rollouts prepared or being prepared and not yet running: with prepare concurrency 1 the broker
sends it one message at a time, so the bound is exact (`workers.admission`).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, RolloutStatus
from tests.reliability.private_redis import PrivateRedis
from tests.reliability.support import (
    RelStack,
    check_invariants,
    rel_stack,
    statuses,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e]

SMALL = {Stage.PREPARE: 1, Stage.RUN_AGENT: 1, Stage.BUILD: 1, Stage.EVALUATE: 1}
BIG = {Stage.PREPARE: 1, Stage.RUN_AGENT: 4, Stage.BUILD: 2, Stage.EVALUATE: 2}
WINDOW = SMALL[Stage.RUN_AGENT]
"""The small node's window: the default, its run-agent concurrency."""


def _started(factory: sessionmaker[Session], ids: list[str]) -> list[Event]:
    with factory() as session:
        return list(
            session.scalars(
                select(Event).where(
                    Event.rollout_id.in_([uuid.UUID(r) for r in ids]),
                    Event.kind == EventKind.STARTED,
                )
            )
        )


def most_held(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals [start, end) open at one instant (an end before a start at a tie)."""
    edges = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    held = most = 0
    for _, step in edges:
        held += step
        most = max(most, held)
    return most


def test_a_small_node_holds_no_more_than_its_window(
    pool: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    small = pool.stack.node("node-small", SMALL, janitor=False)
    big = pool.stack.node("node-big", BIG, janitor=False)
    tasks = [{"instruction": f"t{i}", "sleep_s": 2.0} for i in range(12)]
    ids = pool.submit(tasks)
    wait_terminal(db_session_factory, ids, timeout_s=180)

    rollouts = check_invariants(pool, db_session_factory, ids)
    assert {(r.status, r.attempt) for r in rollouts.values()} == {(RolloutStatus.COMPLETED, 1)}
    events = _started(db_session_factory, ids)
    began: dict[tuple[str, str], datetime] = {}
    for event in events:
        node = (event.worker or "").split("/", 1)[0]
        if event.stage in (Stage.PREPARE, Stage.RUN_AGENT):
            assert (str(event.rollout_id), event.stage) not in began, "a stage started twice"
            began[str(event.rollout_id), event.stage] = event.at
            if event.stage == Stage.PREPARE:
                assert node == rollouts[str(event.rollout_id)].node
    on_small = [rid for rid, r in rollouts.items() if r.node == "node-small"]
    waiting = [(began[rid, Stage.PREPARE], began[rid, Stage.RUN_AGENT]) for rid in on_small]
    held = most_held(waiting)
    print(f"node-small took {len(on_small)} of {len(ids)}, held at most {held} not running")
    assert held <= WINDOW, f"node-small held {held} rollouts prepared and not running"
    assert len(on_small) >= 2, "node-small never resumed after its first rollout"
    for proc in (small, big):
        proc.stop()


@pytest.mark.reliability
def test_a_node_paused_across_a_broker_restart_consumes_again(
    redis: PrivateRedis, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    """A pause deselects the prepare queue, and Celery rebuilds its consumer from the selected
    queues when it reconnects. Here the backlog empties while the broker is away (the prepared
    rollout is cancelled), so the restarted consumer's first decision is "consume": it must have
    selected the queue again itself, or the node would never prepare anything more."""
    with rel_stack(pg_url, tmp_path, workers=False, broker_url=redis.url) as rel:
        node = rel.stack.node("node-one", SMALL, janitor=False)
        ids = rel.submit([{"instruction": f"t{i}", "sleep_s": 8.0} for i in range(4)])

        def paused() -> str | None:
            found = statuses(db_session_factory, ids)
            if Counter(found.values()) != {"running": 1, "prepared": 1, "queued": 2}:
                return None
            return next(rid for rid, status in found.items() if status == "prepared")

        wait_until(paused, 60, "one running, one prepared, two left in the queue")
        time.sleep(1.0)  # a few decisions later: the prepare that filled the window is not held
        prepared = paused()
        assert prepared is not None and "prepare paused" in node.log_tail(100_000)
        redis.stop()
        rel.client.cancel_rollout(prepared)
        time.sleep(1.0)
        redis.start()  # no persistence: the sweeper sends the lost messages again
        wait_terminal(db_session_factory, ids, timeout_s=120)
        rollouts = check_invariants(rel, db_session_factory, ids)
        assert {rid: (r.status, r.node) for rid, r in rollouts.items()} == {
            rid: (RolloutStatus.CANCELLED if rid == prepared else RolloutStatus.COMPLETED,
                  "node-one")
            for rid in ids
        }  # fmt: skip
        node.stop()


def test_most_held_counts_overlaps() -> None:
    t = [datetime(2026, 1, 1, 0, 0, s) for s in range(6)]
    assert most_held([]) == 0
    assert most_held([(t[0], t[2]), (t[2], t[4])]) == 1  # one ends as the next begins
    assert most_held([(t[0], t[3]), (t[1], t[2]), (t[1], t[5])]) == 3
