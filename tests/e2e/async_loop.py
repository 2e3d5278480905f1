"""An asynchronous RL loop against a running stack, and the checks the async e2e tests share.

The loop is what a trainer does (docs/async_rl.md): stream batches of complete groups of a job
submitted with `staleness`, check each group is fresh enough, and after each batch update the
weights: `set_policy(v + 1, pause=True)` (calls in flight drain), "load weights", then
`resume_policy()`. Every step is timestamped so the database can be checked against it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.infra.tls import client_ssl_context
from polar_mq.models import GroupDelivery, LlmCall, Rollout, StaleGroup


@dataclass
class Update:
    version: int
    paused_at: datetime
    resumed_at: datetime
    answer: dict[str, Any]


@dataclass
class LoopRecord:
    leased_at_version: dict[int, int] = field(default_factory=dict)
    """task_index → the policy version when the trainer received the group."""
    received: list[dict[str, Any]] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)


def run_loop(
    client: Client,
    job_id: str,
    batch_size: int,
    updates: int,
    load_weights_s: float = 0.2,
    before_pause: Callable[[int], None] | None = None,
) -> LoopRecord:
    """`before_pause(i)` runs before the i-th pause (a test can wait there for a call in flight)."""
    record = LoopRecord()
    version = int(client.policy()["version"])
    stream = client.stream_groups(job_id, batch_size=batch_size, consumer="trainer", wait_s=2.0)
    for batch in stream:
        for group in batch:
            record.leased_at_version[group["task_index"]] = version
            record.received.append(group)
        if len(record.updates) < updates:
            if before_pause is not None:
                before_pause(len(record.updates))
            paused_at = datetime.now(UTC)
            answer = client.set_policy(version + 1, pause=True, drain_timeout_s=30.0)
            time.sleep(load_weights_s)  # the trainer loads the new weights into the engine
            client.resume_policy()
            version += 1
            record.updates.append(Update(version, paused_at, datetime.now(UTC), answer))
    return record


def wait_for_call_in_flight(proxy_url: str, timeout_s: float) -> bool:
    """Whether the proxy holds an upstream call open within `timeout_s` (admin view, loopback)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, verify=client_ssl_context()) as http:
        while time.monotonic() < deadline:
            backends = http.get(f"{proxy_url}/admin/backends").json()["backends"]
            if sum(b["in_flight"] for b in backends) > 0:
                return True
            time.sleep(0.02)
    return False


def check_loop(
    factory: sessionmaker[Session], job_id: str, record: LoopRecord, max_staleness: int
) -> dict[str, int]:
    """The invariants of an asynchronous run; returns counts for the test to report."""
    job = uuid.UUID(job_id)
    for update in record.updates:
        answer = update.answer
        assert answer["drained"] is True and answer["in_flight"] == 0, answer
        assert all(p["ok"] for p in answer["proxies"]), answer
    current = (Rollout.id == LlmCall.rollout_id) & (Rollout.attempt == LlmCall.attempt)
    with factory() as session:
        calls = session.execute(
            select(Rollout.task_index, LlmCall.policy_version, LlmCall.created_at,
                   LlmCall.status_code, LlmCall.complete)
            .join(Rollout, current)
            .where(Rollout.job_id == job, LlmCall.purpose == "agent")
        ).all()  # fmt: skip
        deliveries = session.scalars(select(GroupDelivery).where(GroupDelivery.job_id == job)).all()
        stale = session.scalars(select(StaleGroup).where(StaleGroup.job_id == job)).all()
        n_tasks = len(set(session.scalars(select(Rollout.task_index).where(Rollout.job_id == job))))
    # a pause never cut a call: every answered call ran to its end, none was abandoned midway
    # (a call held longer than POLAR_MQ_PAUSE_MAX_WAIT_S gets a retryable 503: not a cut)
    cut = [
        (c.task_index, c.status_code, c.complete, c.created_at)
        for c in calls
        if c.status_code == 499 or (c.status_code == 200 and not c.complete)
    ]
    assert cut == [], cut
    assert sum(c.status_code == 200 for c in calls) >= len(calls) * 0.9, calls
    # each call carries the version that served it: old before a pause, new after the resume
    for update in record.updates:
        before = [c for c in calls if c.created_at < update.paused_at]
        after = [c for c in calls if c.created_at > update.resumed_at]
        assert all(c.policy_version < update.version for c in before)
        assert all(c.policy_version >= update.version for c in after)
    # no accepted sample older than allowed: judged at the version the trainer received it
    oldest: dict[int, int] = {}
    for c in calls:
        oldest[c.task_index] = min(oldest.get(c.task_index, c.policy_version), c.policy_version)
    acked = {d.task_index for d in deliveries if d.acked_at is not None}
    for index in acked:
        assert oldest[index] >= record.leased_at_version[index] - max_staleness, index
    # no group lost, none delivered (acknowledged) twice, none both acked and withheld
    received = [g["task_index"] for g in record.received]
    assert sorted(received) == sorted(acked)  # the trainer acked exactly what it trained on
    assert len(received) == len(set(received))
    withheld = {s.task_index for s in stale}
    assert not acked & withheld
    assert acked | withheld == set(range(n_tasks))
    drained = sum(u.answer["drained_calls"] for u in record.updates)
    return {"acked": len(acked), "stale": len(withheld), "calls": len(calls), "drained": drained}
