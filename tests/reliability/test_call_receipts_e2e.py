"""The run-agent stage knows its agent's calls are stored from their receipts, not a proxy flush.

A real stack whose proxy's call writer lingers 1.5 s before each commit (so every agent exits
long before its last calls are in the database): each rollout must still be built from every
call its agent saw answered, and the stage must have known it from the attempt's receipts (its
`finished` event says `calls_stored_by: receipts`); an agent that made no call is not waited for.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Rollout, TrajectorySample
from tests.reliability.support import (
    RelStack,
    agent_seen_calls,
    check_invariants,
    rel_stack,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]


@pytest.fixture()
def slow_writer(pg_url: str, tmp_path: Path) -> Iterator[RelStack]:
    # answer first (`proxy_durable_answers=False`): the receipts are the safety net there
    with rel_stack(
        pg_url, tmp_path, log_flush_interval_s=1.5, proxy_durable_answers=False
    ) as stack:
        yield stack


def _agent_details(factory: sessionmaker[Session], ids: list[str]) -> dict[str, dict[str, Any]]:
    with factory() as session:
        rows = session.execute(
            select(Event.rollout_id, Event.detail).where(
                Event.rollout_id.in_([uuid.UUID(i) for i in ids]),
                Event.stage == Stage.RUN_AGENT,
                Event.kind == EventKind.FINISHED,
            )
        ).all()
    return {str(rid): dict(detail or {}) for rid, detail in rows}


def test_a_slow_writer_is_waited_for_by_receipts(
    slow_writer: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    tasks = [{"instruction": f"task {i}", "calls": 3} for i in range(4)]
    tasks.append({"instruction": "no call", "calls": 0})
    ids = slow_writer.submit(tasks)
    wait_terminal(db_session_factory, ids, 120)
    # every call each agent saw answered is logged once and built into its samples
    rollouts = check_invariants(
        slow_writer, db_session_factory, ids, dict.fromkeys(ids, "completed")
    )
    details = _agent_details(db_session_factory, ids)
    assert set(details) == set(ids)
    for rid, detail in details.items():
        assert detail["calls_stored_by"] == "receipts", detail
        made = 0 if rollouts[rid].task_index == 4 else 3
        assert (detail["calls_started"], detail["agent_calls"]) == (made, made), detail
        if made == 0:
            assert detail["wakeups"] == 0, detail  # nothing to wait for: not waited
    waited = [d for d in details.values() if d["calls_started"]]
    assert any(d["wakeups"] >= 1 for d in waited), waited  # the writer was slower than the agent


@pytest.fixture()
def lingering_writer(pg_url: str, tmp_path: Path) -> Iterator[RelStack]:
    """The proxy's writer holds rows 30 s (unless a stage hurries it); receipts waited 1 s."""
    with rel_stack(
        pg_url, tmp_path, log_flush_interval_s=30.0, call_receipts_wait_s=1.0,
        proxy_durable_answers=False,
    ) as s:  # fmt: skip
        yield s


def _agents_seen(rel: RelStack) -> set[str]:
    return {rid for rid, _ in agent_seen_calls(rel.call_log)}


def test_calls_lost_with_a_killed_proxy_start_the_attempt_over(
    lingering_writer: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    """SIGKILL the proxy while each agent's first call is still only in its writer's memory and
    bring it back before their second call: the agents exit 0, but the receipts say a call was
    never stored, so the attempt starts over instead of building from half its calls."""
    rel = lingering_writer
    ids = rel.submit([{"instruction": f"task {i}", "calls": 2, "sleep_s": 8} for i in range(2)])
    # every agent's first call, not two calls of one agent (a loaded machine may start the
    # second agent after the first one's 8 s sleep; its calls would then never meet the kill)
    wait_until(lambda: _agents_seen(rel) >= set(ids), 60, "every agent's first call")
    (proxy,) = [p for p in rel.stack.processes if p.name == "proxy"]
    proxy.stop(signal.SIGKILL, grace_s=5)  # the first calls' rows die with it
    rel.stack.proxy()  # back before the agents' second calls
    wait_terminal(db_session_factory, ids, 120)
    # (`check_invariants` would also demand the lost rows: a SIGKILLed proxy's unwritten queue
    # is gone; what must hold is that no trajectory is built without them)
    with db_session_factory() as session:
        rollouts = session.scalars(
            select(Rollout).where(Rollout.id.in_([uuid.UUID(i) for i in ids]))
        ).all()
        for rollout in rollouts:
            assert rollout.status == "completed" and rollout.attempt >= 2, rollout.error
            samples = session.scalars(
                select(TrajectorySample.attempt).where(TrajectorySample.rollout_id == rollout.id)
            ).all()
            assert samples == [rollout.attempt] * 2  # both calls of the final attempt, only
        requeued = session.scalars(
            select(Event.detail).where(
                Event.rollout_id.in_([uuid.UUID(i) for i in ids]),
                Event.kind == EventKind.REQUEUED,
            )
        ).all()
    # Either way the platform's failure, not the policy's: the receipts said calls were lost
    # with the old process, or (a loaded machine) an agent's call met the proxy while it was down
    restarts = ("lost with the old process", "proxy restarted while the agent ran")
    assert requeued and all(any(r in str(d) for r in restarts) for d in requeued), requeued
