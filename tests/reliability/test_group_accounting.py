"""Infrastructure failures inside a group, end to end: never scored 0, excluded or retried.

One sample of a GRPO group is lost to infrastructure in two ways: cancelled (an infrastructure
outcome: the group is delivered `incomplete` and its statistics use the other samples only), and
its worker killed (the rollout is retried with attempt+1 and the group completes whole, with only
the final attempt's samples).
"""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.stages import Stage
from tests.reliability.support import (
    RelStack,
    agent_seen_calls,
    check_invariants,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]


def _job_id(rel: RelStack, rollout_id: str) -> str:
    return str(rel.client.rollout(rollout_id)["job_id"])


def test_cancelled_sample_makes_its_group_incomplete_not_zero(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    ids = rel.submit([{"instruction": "x", "sleep_s": 3}], samples=4)
    wait_until(lambda: len(agent_seen_calls(rel.call_log)) >= 1, 60, "an agent to start")
    lost = ids[0]
    assert [str(r) for r in rel.client.cancel_rollout(lost)["cancelled"]] == [lost]
    wait_terminal(db_session_factory, ids, 60)
    check_invariants(rel, db_session_factory, ids, {lost: "cancelled"})
    (group,) = rel.client.results(_job_id(rel, lost), advantages="grpo")
    assert group["complete"] and group["incomplete"]
    assert (group["n_samples"], group["n_usable"]) == (4, 3)
    assert group["mean_reward"] == 1.0, "the cancelled sample must not count as a 0"
    by_id = {str(s["rollout_id"]): s for s in group["samples"]}
    assert by_id[lost]["termination_reason"] == "cancelled"
    assert by_id[lost]["reward"] is None and not by_id[lost]["usable"]
    assert by_id[lost]["advantage"] is None
    assert all(by_id[i]["usable"] and by_id[i]["reward"] == 1.0 for i in ids[1:])


def test_sample_lost_with_its_worker_is_retried_and_the_group_completes_whole(
    rel: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    ids = rel.submit([{"instruction": "x", "sleep_s": 3}], samples=3)
    wait_until(lambda: len(agent_seen_calls(rel.call_log)) >= 3, 60, "the agents to start")
    os.kill(rel.worker_main(Stage.RUN_AGENT).pid, signal.SIGKILL)
    wait_terminal(db_session_factory, ids, 90)
    rollouts = check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
    (group,) = rel.client.results(_job_id(rel, ids[0]), include_trajectories=True)
    assert group["complete"] and not group["incomplete"]
    assert (group["n_samples"], group["n_usable"]) == (3, 3)
    for sample in group["samples"]:
        rollout = rollouts[str(sample["rollout_id"])]
        assert sample["attempt"] == rollout.attempt == 2
        assert sample["trajectories"], "the final attempt's samples are delivered"
