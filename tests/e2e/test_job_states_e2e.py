"""Truthful job states, charts and task states with real workers (the fault-injection stack).

- retries: the proxy is killed under agents between their two calls and comes back, so every
  first attempt ends `backend_error` on the platform's side and starts over; the job still ends
  `completed`, the old attempts are closed on the chart and the timeline, and Celery (hence
  Flower) records the first attempt's run_agent task as FAILURE, not SUCCESS (`restart:requeued`);
- a job whose every rollout fails, and one where some do: `failed`, `completed_with_failures`;
- a cancelled job: `cancelled`, `cancelled_at` set, nothing left running on the chart.

Celery's result backend (a Redis database of its own) is where the task states are read: Flower
shows the same states, from the same task events.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.jobs.read_models import EventRecord
from polar_mq.models import Event, EventKind, LlmCall, Rollout
from polar_mq.ui.queries import stage_intervals
from polar_mq.ui.timeline import stage_spans
from tests.reliability.support import (
    RelStack,
    agent_command,
    rel_stack,
    wait_status,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]

RESULTS_URL = "redis://127.0.0.1:6379/5"
"""Celery's result backend for this module's stack (task states, as Flower reports them)."""
FAILS_UNLESS_ASKED = f'grep -q \'"broken"\' "$POLAR_TASK_FILE" && exit 3; exec {agent_command()}'
"""The fault suite's agent, except for tasks marked `broken`: they exit 3 before any LLM call
(`runtime_error`, an infrastructure failure that is not retried)."""


@pytest.fixture(scope="module")
def rel(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelStack]:
    with rel_stack(pg_url, tmp_path_factory.mktemp("job-states"), result_backend=RESULTS_URL) as s:
        yield s


def _uuids(ids: list[str]) -> list[uuid.UUID]:
    return [uuid.UUID(i) for i in ids]


def _job_of(factory: sessionmaker[Session], rollout_id: str) -> uuid.UUID:
    with factory() as session:
        return session.get_one(Rollout, uuid.UUID(rollout_id)).job_id


def _open_runs(factory: sessionmaker[Session], job_id: uuid.UUID) -> int:
    with factory() as session:
        return sum(1 for _, _, end in stage_intervals(session, job_id) if end is None)


def _task_state(task_id: str) -> str | None:
    """The Celery state of a task from the result backend: `SUCCESS`, or `FAILURE <what the
    stage did>` (the message of the exception the task raised)."""
    raw = redis.Redis.from_url(RESULTS_URL).get(f"celery-task-meta-{task_id}")
    if raw is None:
        return None
    meta = json.loads(raw)
    if meta["status"] == "SUCCESS":
        return "SUCCESS"
    message = meta["result"].get("exc_message") if isinstance(meta["result"], dict) else None
    what = message[0] if isinstance(message, list) and message else message
    return f"{meta['status']} {what}"


def _stage_tasks(
    factory: sessionmaker[Session], ids: list[str], stage: str, attempt: int
) -> list[str]:
    """The Celery task ids that ran `stage` of `attempt` (the lease owner ends with it)."""
    with factory() as session:
        workers = session.scalars(
            select(Event.worker).where(
                Event.rollout_id.in_(_uuids(ids)), Event.stage == stage,
                Event.attempt == attempt, Event.kind == EventKind.STARTED,
            )
        ).all()  # fmt: skip
    return [str(w).rsplit("/", 1)[-1] for w in workers]


def _settled_states(task_ids: list[str]) -> set[str | None]:
    wait_until(lambda: all(_task_state(t) is not None for t in task_ids), 60, "task results")
    return {_task_state(t) for t in task_ids}


def _calls(factory: sessionmaker[Session], ids: list[str]) -> int:
    with factory() as session:
        rows = session.scalars(select(LlmCall.id).where(LlmCall.rollout_id.in_(_uuids(ids))))
        return len(rows.all())


def _events(factory: sessionmaker[Session], rollout_id: str) -> list[EventRecord]:
    with factory() as session:
        rows = session.scalars(
            select(Event).where(Event.rollout_id == uuid.UUID(rollout_id)).order_by(Event.id)
        ).all()
        return [
            EventRecord(e.id, e.stage, e.kind, e.attempt, e.worker, e.at, e.detail) for e in rows
        ]


def test_retried_attempts_are_closed_and_failed_in_flower(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    tasks = [{"instruction": f"task {i}", "calls": 2, "sleep_s": 5} for i in range(2)]
    ids = rel.submit(tasks, retries={"max_attempts": 3})
    wait_until(lambda: _calls(db_session_factory, ids) >= len(ids), 60, "every first call")
    (proxy,) = [p for p in rel.stack.processes if p.name == "proxy"]
    proxy.stop(signal.SIGKILL, grace_s=5)  # the agents' second calls are refused
    time.sleep(7)  # not an assertion: the window in which the agents meet no proxy
    rel.stack.proxy()
    wait_terminal(db_session_factory, ids, 120)

    job_id = _job_of(db_session_factory, ids[0])
    status = rel.client.status(str(job_id))
    assert status["state"] == "completed", status
    assert all(slots["running"] == 0 for slots in status["stages"].values())
    assert _open_runs(db_session_factory, job_id) == 0
    for rid in ids:
        spans, _ = stage_spans(_events(db_session_factory, rid))
        first_agent = next(s for s in spans if s.attempt == 1 and s.stage == "run_agent")
        assert first_agent.outcome == "retried", spans
        assert not [s for s in spans if s.outcome in ("queued", "running")], spans

    first = _settled_states(_stage_tasks(db_session_factory, ids, "run_agent", 1))
    assert first == {"FAILURE restart:requeued"}, first
    assert _settled_states(_stage_tasks(db_session_factory, ids, "run_agent", 2)) == {"SUCCESS"}


def test_all_failed_and_partly_failed_jobs(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    harness: dict[str, Any] = {"type": "command", "command": FAILS_UNLESS_ASKED}
    broken = {"instruction": "broken task", "broken": True, "calls": 1}
    fine = {"instruction": "fine task", "calls": 1}
    failed = rel.submit([broken], samples=2, harness=dict(harness))
    mixed = rel.submit([broken, fine], samples=1, harness=dict(harness))
    wait_terminal(db_session_factory, failed + mixed, 120)

    failed_status = rel.client.status(str(_job_of(db_session_factory, failed[0])))
    assert failed_status["state"] == "failed", failed_status
    assert failed_status["by_termination_reason"] == {"runtime_error": 2}
    mixed_status = rel.client.status(str(_job_of(db_session_factory, mixed[0])))
    assert mixed_status["state"] == "completed_with_failures", mixed_status
    assert mixed_status["cancelled_at"] is None
    states = _settled_states(_stage_tasks(db_session_factory, failed, "run_agent", 1))
    assert states == {"FAILURE failed:runtime_error"}, states


def test_cancelled_job_is_cancelled_and_closed(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    ids = rel.submit([{"instruction": "long", "calls": 2, "sleep_s": 600}], samples=2)
    wait_status(db_session_factory, ids, "running", 60)  # both agents started
    job_id = _job_of(db_session_factory, ids[0])
    rel.client.cancel(str(job_id))

    status = rel.client.status(str(job_id))
    assert status["state"] == "cancelled" and status["cancelled_at"] is not None, status
    assert status["by_status"] == {"cancelled": 2}
    assert all(slots["running"] == 0 for slots in status["stages"].values())
    assert _open_runs(db_session_factory, job_id) == 0
    for rid in ids:
        spans, _ = stage_spans(_events(db_session_factory, rid))
        assert not [s for s in spans if s.outcome in ("queued", "running")], spans
    # the agents are killed within a heartbeat; their stage tasks then end, not as a SUCCESS
    tasks = _stage_tasks(db_session_factory, ids, "run_agent", 1)
    assert tasks and _settled_states(tasks) == {"FAILURE lease_lost"}
