"""Scenarios 8-10: agents that will not die, stages that always raise, cancellation at any stage."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import Event, EventKind, Rollout
from tests.reliability.support import (
    RelStack,
    check_invariants,
    statuses,
    wait_status,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]


def test_hung_agents_are_killed_with_their_daemons(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    tasks = [
        {"instruction": "hang, ignoring SIGTERM", "calls": 1, "hang": True, "ignore_sigterm": True},
        {"instruction": "hang with a daemon", "calls": 1, "hang": True, "daemon": True},
    ]
    by_timeout = rel.submit(tasks, timeouts={"agent_s": 4})
    by_watchdog = rel.submit(tasks, timeouts={"agent_s": 60, "inactivity_s": 2})
    ids = by_timeout + by_watchdog
    started = time.monotonic()
    wait_terminal(db_session_factory, ids, 90)
    took_s = time.monotonic() - started
    rollouts = check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
    assert {r.termination_reason for r in rollouts.values()} == {"timeout"}
    assert {r.reward for r in rollouts.values()} == {0.0}, "a timed-out agent did not complete"
    print(f"\nhung agents (wall 4 s / inactivity 2 s) all killed and cleaned in {took_s:.1f} s")


def test_stage_that_always_raises_gives_up_after_bounded_retries(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    ids = rel.submit(
        [{"instruction": "fine agent", "calls": 1}],
        builder="tests.reliability.faulty:AlwaysRaises",
        retries={"stage_retries": 2, "max_attempts": 3},
    )
    wait_terminal(db_session_factory, ids, 60)
    rollouts = check_invariants(rel, db_session_factory, ids, {ids[0]: "failed"})
    failed = rollouts[ids[0]]
    assert failed.termination_reason == "runtime_error"
    assert "builder bug" in (failed.error or "")
    assert failed.attempt == 1, "a stage bug is retried in place, not by re-running the agent"
    with db_session_factory() as session:
        retried = session.scalars(
            select(Event).where(
                Event.rollout_id == uuid.UUID(ids[0]), Event.kind == EventKind.RETRIED
            )
        ).all()
    assert [e.detail["retry"] for e in retried] == [1, 2]
    delays = [e.detail["delay_s"] for e in retried]
    assert delays[1] > delays[0], "backoff grows"


def test_cancel_at_every_stage(rel: RelStack, db_session_factory: sessionmaker[Session]) -> None:
    jobs = {
        "prepare": rel.submit(
            [{"instruction": "x"}],
            runtime={"prepare": {"commands": ["sleep 60"]}},
            timeouts={"prepare_s": 120},
        ),
        "run_agent": rel.submit([{"instruction": "x", "sleep_s": 60}]),
        "build": rel.submit(
            [{"instruction": "x", "calls": 1}], builder="tests.reliability.faulty:SlowBuilder"
        ),
        "evaluate": rel.submit(
            [{"instruction": "x", "calls": 1}],
            evaluator={"name": "command", "command": "sleep 60"},
            timeouts={"evaluate_s": 120},
        ),
    }
    busy = {
        "prepare": "preparing",
        "run_agent": "running",
        "build": "building",
        "evaluate": "evaluating",
    }
    for stage, ids in jobs.items():
        wait_status(db_session_factory, ids, busy[stage], 60)
    job_ids = {}
    with db_session_factory() as session:
        for stage, ids in jobs.items():
            job_ids[stage] = str(session.get(Rollout, uuid.UUID(ids[0])).job_id)  # type: ignore[union-attr]
    cancelled_at = time.monotonic()
    for stage in jobs:
        result = rel.client.cancel(job_ids[stage])
        assert [str(r) for r in result["cancelled"]] == jobs[stage]
    all_ids = [i for ids in jobs.values() for i in ids]
    assert set(statuses(db_session_factory, all_ids).values()) == {"cancelled"}
    rollouts = check_invariants(rel, db_session_factory, all_ids, {i: "cancelled" for i in all_ids})
    cleaned_s = time.monotonic() - cancelled_at
    assert {r.termination_reason for r in rollouts.values()} == {"cancelled"}
    assert rel.client.cancel(job_ids["run_agent"])["already_terminal"] == 1, "cancel is idempotent"
    print(f"\ncancel during each stage: every runtime and process gone {cleaned_s:.1f} s later")


def test_cancel_before_any_worker_runs(
    pg_url: str, tmp_path: object, db_session_factory: sessionmaker[Session]
) -> None:
    from pathlib import Path

    from tests.reliability.support import rel_stack

    with rel_stack(pg_url, Path(str(tmp_path)), workers=False) as rel:
        ids = rel.submit([{"instruction": "never runs"}], samples=3)
        rollout = uuid.UUID(ids[0])
        with db_session_factory() as session:
            job_id = str(session.get(Rollout, rollout).job_id)  # type: ignore[union-attr]
        assert len(rel.client.cancel(job_id)["cancelled"]) == 3
        rel.start_workers()
        wait_until(
            lambda: _skipped(db_session_factory, ids) >= 3, 30, "queued messages to be no-ops"
        )
        check_invariants(rel, db_session_factory, ids, {i: "cancelled" for i in ids})


def _skipped(factory: sessionmaker[Session], ids: list[str]) -> int:
    with factory() as session:
        return len(
            session.scalars(
                select(Event.id).where(
                    Event.rollout_id.in_([uuid.UUID(i) for i in ids]),
                    Event.kind == EventKind.SKIPPED,
                )
            ).all()
        )
