"""Over-provisioning end to end: real Celery workers, real proxy, the fake vLLM upstream.

The agent (`early_stop_agent.py`, a command harness) makes the first `fast_samples` samples of
each task fast and the rest sleep for `SLOW_S`, far longer than these tests may take: only the
early stop can end them. The stack runs with a short stage lease so a cancelled agent is killed
within two seconds (its worker loses the lease at the next heartbeat, every lease_s / 3). Not
shorter: a heartbeat landing between a stage's commit and the end of its lease hold reads as a
lost lease and releases the runtime (a runner race this test must not depend on).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, Rollout
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack

pytestmark = pytest.mark.e2e

AGENT = Path(__file__).with_name("early_stop_agent.py")
SLOW_S = 900.0
"""How long a straggler would run: the tests must be over long before (nothing waits for it)."""
DEADLINE_S = 240.0


@pytest.fixture(scope="module")
def stop_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with fake_upstream_stack(
        pg_url,
        tmp_path_factory.mktemp("e2e-early-stop"),
        concurrency={Stage.RUN_AGENT: 12, Stage.PREPARE: 4},
        lease_s=6.0,
    ) as stack:
        yield stack


def _submit(
    client: Client, tmp: Path, tasks: list[dict[str, Any]], samples: int, **spec: Any
) -> tuple[str, str]:
    marker = f"earlystop-{uuid.uuid4().hex}"
    command = (
        f"{{python}} {AGENT} --slots {tmp / 'slots'} --size {samples} "
        f"--slow-s {SLOW_S} --marker {marker}"
    )
    job_id = client.submit(
        tasks, samples_per_task=samples, harness={"type": "command", "command": command},
        evaluator="completed", timeouts={"agent_s": SLOW_S + 60}, **spec,
    ).job_id  # fmt: skip
    return str(job_id), marker


def _stream(client: Client, job_id: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for batch in client.stream_groups(job_id, batch_size=1, lease_s=60, wait_s=2):
        groups.extend(batch)
    return groups


def _agents_alive(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def _wait_no_agents(marker: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _agents_alive(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _agents_alive(marker) == [], "an agent outlived the early stop"


def _fast_rollouts(tmp: Path, fast: int) -> set[uuid.UUID]:
    """The rollouts that took one of the first `fast` slots of their task (agents record it)."""
    slots = tmp / "slots"
    return {uuid.UUID(p.read_text()) for k in range(fast) for p in slots.glob(f"*/{k}/rollout")}


def _diagnosis(factory: sessionmaker[Session], job_id: str) -> list[tuple[Any, ...]]:
    """How each rollout ended (for assertion messages)."""
    with factory() as session:
        rows = session.execute(
            select(
                Rollout.task_index, Rollout.sample_index, Rollout.status,
                Rollout.termination_reason, Rollout.agent_exit_code, Rollout.error,
            )
            .where(Rollout.job_id == uuid.UUID(job_id))
            .order_by(Rollout.task_index, Rollout.sample_index)
        ).all()  # fmt: skip
    return [(*row[:5], (row.error or "")[-300:]) for row in rows]


def _events(
    factory: sessionmaker[Session], job_id: str, kind: str, stage: str | None = None
) -> list[Event]:
    query = select(Event).where(Event.job_id == uuid.UUID(job_id), Event.kind == kind)
    if stage is not None:
        query = query.where(Event.stage == stage)
    with factory() as session:
        return list(session.scalars(query))


def test_groups_complete_with_two_usable_samples_and_stragglers_are_killed(
    stop_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    tasks = [{"instruction": f"early stop task {i}", "fast_samples": 2} for i in range(3)]
    started = time.monotonic()
    with client_of(stop_stack) as client:
        job_id, marker = _submit(client, tmp_path, tasks, 4, stop={"usable_samples_per_group": 2})
        groups = _stream(client, job_id)
        elapsed = time.monotonic() - started
        status = client.status(job_id)
    assert elapsed < DEADLINE_S < SLOW_S  # delivered long before any straggler could finish

    why = _diagnosis(db_session_factory, job_id)
    assert sorted(g["task_index"] for g in groups) == [0, 1, 2], why
    fast_ids = _fast_rollouts(tmp_path, 2)
    with db_session_factory() as session:
        rollouts = session.scalars(
            select(Rollout.id).where(Rollout.job_id == uuid.UUID(job_id))
        ).all()
    assert len(fast_ids) == 6 and fast_ids <= set(rollouts)
    for group in groups:
        assert group["complete"] and not group["incomplete"] and group["n_usable"] == 2
        usable = {uuid.UUID(s["rollout_id"]) for s in group["samples"] if s["usable"]}
        assert len(usable) == 2 and usable <= fast_ids, (group, why)
        late = [s for s in group["samples"] if s["straggler"]]
        assert len(late) == 2 and not any(s["usable"] for s in late)

    assert status["state"] == "completed", status
    assert status["by_status"] == {"completed": 6, "cancelled": 6}, why
    assert status["groups_complete"] == 3
    cancels = _events(db_session_factory, job_id, EventKind.CANCELLED)
    stragglers = {e.rollout_id for e in cancels}
    assert len(cancels) == 6 and not stragglers & fast_ids
    assert all(e.detail == {"early_stop": "group_complete", "usable_samples_per_group": 2}
               for e in cancels)  # fmt: skip
    ran = {
        e.rollout_id for e in _events(db_session_factory, job_id, EventKind.STARTED, "run_agent")
    }
    assert stragglers <= ran  # every straggler's agent was running when it was cancelled
    _wait_no_agents(marker)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the lease keeper released each straggler's runtime
        released = {e.rollout_id for e in _events(db_session_factory, job_id, "runtime_released")}
        if stragglers <= released:
            break
        time.sleep(0.2)
    assert stragglers <= released


def test_the_job_stops_after_m_groups_and_cancels_the_rest(
    stop_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    tasks = [
        {"instruction": f"stop job task {i}", "fast_samples": 2 if i < 2 else 0} for i in range(4)
    ]
    started = time.monotonic()
    with client_of(stop_stack) as client:
        job_id, marker = _submit(client, tmp_path, tasks, 2, stop={"groups": 2})
        groups = _stream(client, job_id)
        elapsed = time.monotonic() - started
        status = client.status(job_id)
    assert elapsed < DEADLINE_S < SLOW_S

    good = [g for g in groups if not g["incomplete"]]
    cut = [g for g in groups if g["incomplete"]]
    why = _diagnosis(db_session_factory, job_id)
    assert sorted(g["task_index"] for g in good) == [0, 1], why
    assert all(g["n_usable"] == 2 for g in good)
    assert sorted(g["task_index"] for g in cut) == [2, 3]  # delivered, flagged, nothing usable
    assert all(g["n_usable"] == 0 for g in cut)
    assert all(s["termination_reason"] == "cancelled" for g in cut for s in g["samples"])

    assert status["state"] == "stopped", status
    stop = status["stop"]
    assert stop["stopped"] and stop["groups"] == 2 and stop["groups_complete_at_stop"] == 2
    assert (stop["groups_stopped"], stop["rollouts_cancelled"]) == (2, 4)
    assert status["by_status"] == {"completed": 4, "cancelled": 4}, why
    cancels = _events(db_session_factory, job_id, EventKind.CANCELLED)
    assert len(cancels) == 4 and all(e.detail["early_stop"] == "job_stopped" for e in cancels)
    assert len(_events(db_session_factory, job_id, EventKind.STOPPED)) == 1
    _wait_no_agents(marker)
