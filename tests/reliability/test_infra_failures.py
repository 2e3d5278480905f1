"""Infrastructure failures are recognised from the platform's side and never scored.

Scenario: the proxy is killed while agents sleep between their two calls and comes back seconds
later. Their second call meets a refused connection, so they exit non-zero: without the platform's
view they would be stored as `agent_error` with reward 0, poisoning the group. The run-agent stage
sees that the proxy restarted during the agent's run (its start time is later than the agent's),
so the attempt ends `backend_error`, unscored, and the rollout starts over; the new attempt
completes and is the only one trained on.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import Event, EventKind, LlmCall
from tests.reliability.support import RelStack, check_invariants, wait_terminal, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]


def _calls(factory: sessionmaker[Session], ids: list[str]) -> int:
    with factory() as session:
        rows = session.scalars(
            select(LlmCall.id).where(LlmCall.rollout_id.in_([uuid.UUID(i) for i in ids]))
        ).all()
    return len(rows)


def test_proxy_restart_under_agents_is_an_infrastructure_failure(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    tasks = [{"instruction": f"task {i}", "calls": 2, "sleep_s": 5} for i in range(3)]
    ids = rel.submit(tasks, retries={"max_attempts": 3})
    wait_until(lambda: _calls(db_session_factory, ids) >= len(ids), 60, "every first call")
    (proxy,) = [p for p in rel.stack.processes if p.name == "proxy"]
    proxy.stop(signal.SIGKILL, grace_s=5)  # the agents' second calls are refused
    time.sleep(7)
    rel.stack.proxy()  # back, as a supervisor would bring it back
    wait_terminal(db_session_factory, ids, 120)
    rollouts = check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
    with db_session_factory() as session:
        restarts = session.execute(
            select(Event.rollout_id, Event.detail).where(
                Event.rollout_id.in_([uuid.UUID(i) for i in ids]), Event.kind == EventKind.REQUEUED
            )
        ).all()
    for rid, rollout in rollouts.items():
        assert rollout.attempt >= 2, (rid, rollout.error)
        assert rollout.termination_reason == "completed" and rollout.reward == 1.0
    reasons = {str(detail.get("reason")) for _, detail in restarts}
    assert reasons == {"backend_error"}, restarts
    assert any("proxy restarted" in str(detail) for _, detail in restarts), restarts
