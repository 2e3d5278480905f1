"""The stage table covers every rollout status exactly once: nothing is left without an owner."""

from __future__ import annotations

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
