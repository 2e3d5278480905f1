"""The stage table covers every rollout status exactly once: nothing is left without an owner."""

from __future__ import annotations

import pytest

from polar_mq.lifecycle.messages import queue_name
from polar_mq.lifecycle.stages import BUSY, NEXT_STAGE, READY, STAGE_OF_STATUS, STAGE_STATES, Stage
from polar_mq.models import RolloutStatus


def test_every_status_is_held_terminal_or_in_exactly_one_stage() -> None:
    staged = [status for states in STAGE_STATES.values() for status in states[:2]]
    assert len(staged) == len(set(staged))  # no status is ready or busy for two stages
    others = set(RolloutStatus.ALL) - set(staged)
    assert others == {RolloutStatus.HELD, *RolloutStatus.TERMINAL}
    assert set(STAGE_OF_STATUS) == set(staged)
    assert set(BUSY) | set(READY) == set(staged)


def test_each_stage_hands_over_to_the_next_ones_ready_state() -> None:
    for stage, (_, _, done) in STAGE_STATES.items():
        following = NEXT_STAGE[stage]
        if following is None:
            assert done == RolloutStatus.COMPLETED
        else:
            assert done == STAGE_STATES[following][0]
    assert STAGE_OF_STATUS[RolloutStatus.QUEUED] == (Stage.PREPARE.value, "queued")
    assert STAGE_OF_STATUS[RolloutStatus.RUNNING] == (Stage.RUN_AGENT.value, "running")


def test_a_node_local_stage_goes_to_its_nodes_queue_the_others_to_the_pools() -> None:
    """`Stage.node_local` is where the routing is decided (SPEC §3): run agent and evaluate touch
    the runtime, which lives on one node."""
    assert {s for s in Stage if s.node_local} == {Stage.RUN_AGENT, Stage.EVALUATE}
    for stage in Stage:
        where = "n1" if stage.node_local else "cpu"
        assert queue_name("q", stage, "cpu", "n1") == f"q.{stage.value}.{where}"
        if stage.node_local:
            with pytest.raises(ValueError, match="node is required"):
                queue_name("q", stage, "cpu", None)
        else:
            assert queue_name("q", stage, "cpu", None) == f"q.{stage.value}.cpu"
