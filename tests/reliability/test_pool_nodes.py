"""Worker pools: nodes join and leave a pool while a job runs, with real processes.

Each node is one `polar-mq worker` supervisor (one Celery worker per stage) with its own
POLAR_MQ_NODE_NAME: it takes prepares from the pool-wide queue and serves its own run agent and
evaluate queues. Joining is starting one more; leaving is SIGTERM to its supervisor, which drains
it: no new rollouts from that moment, the ones it holds finish on it, then it exits.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.processes import ManagedProcess, group_members
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.stack.devstack import LocalStack
from tests.reliability.support import (
    RelStack,
    check_invariants,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]

SMALL_NODE = {Stage.PREPARE: 1, Stage.RUN_AGENT: 2, Stage.BUILD: 1, Stage.EVALUATE: 1}
SIGNAL_PATH_S = 1.0
"""How long SIGTERM may take from the test to the node's prepare worker (through the supervisor,
whose handler forwards it) and the worker's consumer to stop, on a loaded CI host: a prepare
message that arrived in that window still runs. A node that kept taking work would start its next
prepare only after its 1 s prepare, and keep on."""


def slow_prepare(seconds: float) -> dict[str, object]:
    """A runtime whose prepare takes a while, so one node cannot take the whole queue at once
    (prepare is bounded by its concurrency only)."""
    return {"prepare": {"commands": [f"sleep {seconds}"]}}


def _rollouts(factory: sessionmaker[Session], ids: list[str]) -> list[Rollout]:
    with factory() as session:
        return list(
            session.scalars(select(Rollout).where(Rollout.id.in_([uuid.UUID(r) for r in ids])))
        )


def _started(factory: sessionmaker[Session], ids: list[str]) -> list[Event]:
    """Every `started` event of these rollouts (`worker` is node/pid/task)."""
    with factory() as session:
        return list(
            session.scalars(
                select(Event).where(
                    Event.rollout_id.in_([uuid.UUID(r) for r in ids]),
                    Event.kind == EventKind.STARTED,
                )
            )
        )


def _node_of(event: Event) -> str:
    return (event.worker or "").split("/", 1)[0]


def _gone(proc: ManagedProcess) -> bool:
    """The supervisor has exited and its group empties (its fork server follows it within
    moments: it exits when the last process that could ask it for a fork is gone)."""
    end = time.monotonic() + 5.0
    while group_members(proc.pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not proc.alive() and not group_members(proc.pid)


def test_a_node_joins_a_running_job(
    pool: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    first = pool.stack.node("node-a", SMALL_NODE, janitor=False)
    # node-a alone needs ~32 s (one prepare slot, 2 s each): node-b, booting under a loaded
    # machine's parallel tests, must still find work left when it is up
    tasks = [{"instruction": f"t{i}", "sleep_s": 0.5} for i in range(8)]
    ids = pool.submit(tasks, samples=2, runtime=slow_prepare(2.0))
    wait_until(
        lambda: any(r.status == RolloutStatus.RUNNING for r in _rollouts(db_session_factory, ids)),
        60,
        "an agent running on node-a",
    )
    joined_at = utcnow()
    second = pool.stack.node("node-b", SMALL_NODE, janitor=False)
    wait_terminal(db_session_factory, ids, timeout_s=120)

    rollouts = check_invariants(pool, db_session_factory, ids)
    assert {r.status for r in rollouts.values()} == {RolloutStatus.COMPLETED}
    nodes = {r.node for r in rollouts.values()}
    assert nodes == {"node-a", "node-b"}, nodes
    by_b = [e for e in _started(db_session_factory, ids) if _node_of(e) == "node-b"]
    assert by_b and all(e.at >= joined_at for e in by_b)
    # node-b's run agent and evaluate stages ran on node-b: the runtime never changed node
    for rollout in rollouts.values():
        local = [
            e for e in _started(db_session_factory, [str(rollout.id)])
            if e.stage in (Stage.RUN_AGENT, Stage.EVALUATE)
        ]  # fmt: skip
        assert {_node_of(e) for e in local} == {rollout.node}
    for proc in (first, second):
        proc.stop()
        assert _gone(proc)


def test_a_node_leaves_by_draining(
    pool: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    """SIGTERM: node-a takes nothing new, finishes what it holds, exits 0 within the bound."""
    leaving = pool.stack.node("node-a", SMALL_NODE, drain_timeout_s=60, janitor=False)
    staying = pool.stack.node("node-b", SMALL_NODE, janitor=False)
    tasks = [{"instruction": f"t{i}", "sleep_s": 2.0} for i in range(6)]
    ids = pool.submit(tasks, samples=2, runtime=slow_prepare(1.0))

    def running_on_a() -> list[Rollout]:
        return [
            r for r in _rollouts(db_session_factory, ids)
            if r.node == "node-a" and r.status == RolloutStatus.RUNNING
        ]  # fmt: skip

    wait_until(lambda: len(running_on_a()) >= 2, 60, "two agents running on node-a")
    unfinished = {
        str(r.id)
        for r in _rollouts(db_session_factory, ids)
        if r.status not in RolloutStatus.TERMINAL
    }
    signalled_at: datetime = utcnow()
    began = time.monotonic()
    LocalStack.drain(leaving)
    drained_s = wait_until(lambda: not leaving.alive(), 30, "node-a to exit after draining")
    assert leaving.proc is not None and leaving.proc.returncode == 0, leaving.log_tail()
    assert drained_s < 20, drained_s
    assert _gone(leaving), "a process of node-a outlived its supervisor"
    wait_terminal(db_session_factory, ids, timeout_s=90)

    rollouts = check_invariants(pool, db_session_factory, ids)
    assert {r.status for r in rollouts.values()} == {RolloutStatus.COMPLETED}
    assert {r.attempt for r in rollouts.values()} == {1}, "a rollout was lost and re-run"
    started = _started(db_session_factory, ids)
    on_a = [e for e in started if _node_of(e) == "node-a"]
    prepared_on_a = {str(e.rollout_id) for e in on_a if e.stage == Stage.PREPARE}
    # nothing new started on node-a after the signal: no prepare once its prepare worker had
    # the signal (at most the one message it was receiving as the signal went through the
    # supervisor, within SIGNAL_PATH_S), and the later stages only for rollouts it had taken
    after = [e for e in on_a if e.at > signalled_at]
    late = [(e.at - signalled_at).total_seconds() for e in after if e.stage == Stage.PREPARE]
    assert len(late) <= SMALL_NODE[Stage.PREPARE], f"prepares started {late} s after SIGTERM"
    assert all(s < SIGNAL_PATH_S for s in late), f"prepares started {late} s after SIGTERM"
    assert {str(e.rollout_id) for e in after if e.stage != Stage.BUILD} <= prepared_on_a
    # what node-a held at the signal finished there
    held = prepared_on_a & unfinished
    assert len(held) >= 2
    assert all(rollouts[rid].node == "node-a" for rid in held)
    assert {r.node for r in rollouts.values()} == {"node-a", "node-b"}
    assert time.monotonic() - began >= drained_s
    print(f"drain: {len(held)} rollouts held at SIGTERM, node-a exited after {drained_s:.1f} s")
    staying.stop()
    assert _gone(staying)


def test_a_drain_that_times_out_leaves_the_rest_to_the_sweeper(
    pool: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    """Agents longer than the drain timeout: node-a stops them (exit code 3) within
    timeout + stop grace; their leases expire and the sweeper re-runs them on node-b."""
    leaving = pool.stack.node(
        "node-a", SMALL_NODE, drain_timeout_s=1.0, stop_grace_s=1.0, janitor=False
    )
    ids = pool.submit([{"instruction": "long", "sleep_s": 5.0}], samples=2)
    wait_until(
        lambda: (
            sum(r.status == RolloutStatus.RUNNING for r in _rollouts(db_session_factory, ids)) == 2
        ),
        60,
        "both agents running on node-a",
    )
    staying = pool.stack.node("node-b", SMALL_NODE, janitor=False)
    began = time.monotonic()
    LocalStack.drain(leaving)
    stopped_s = wait_until(lambda: not leaving.alive(), 20, "node-a to stop")
    assert leaving.proc is not None and leaving.proc.returncode == 3, leaving.log_tail()
    assert stopped_s < 1.0 + 1.0 + 5.0, stopped_s
    assert _gone(leaving)
    wait_terminal(db_session_factory, ids, timeout_s=60)

    rollouts = check_invariants(pool, db_session_factory, ids)
    assert {(r.status, r.node, r.attempt) for r in rollouts.values()} == {
        (RolloutStatus.COMPLETED, "node-b", 2)
    }
    print(f"drain timeout: node-a stopped after {stopped_s:.1f} s; re-run on node-b, "
          f"all done {time.monotonic() - began:.1f} s after SIGTERM")  # fmt: skip
    staying.stop()
    assert _gone(staying)
