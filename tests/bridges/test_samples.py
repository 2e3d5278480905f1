"""The shared reading of polar_mq groups (`polar_mq.bridges.samples`) on groups of a real run."""

from __future__ import annotations

import copy

import pytest

from polar_mq.bridges import BridgeError, training_samples
from tests.bridges.conftest import SAMPLES, TASKS, RealGroups

pytestmark = pytest.mark.e2e


def test_one_aligned_row_per_rollout_with_the_servers_advantage(real_groups: RealGroups) -> None:
    groups = real_groups.load()
    rows = training_samples(groups, pieces="single")
    assert len(rows) == len(TASKS) * SAMPLES
    assert [r.task_index for r in rows] == [i for i in range(len(TASKS)) for _ in range(SAMPLES)]
    for row in rows:
        assert len(row.loss_mask) == len(row.response_ids) > 0
        assert row.logprobs is not None and len(row.logprobs) == len(row.response_ids)
        assert row.input_ids == row.prompt_ids + row.response_ids
        # a multi-turn agent: the tool result sits inside the response under mask 0, with the
        # placeholder logprob, and the model's own tokens are trained
        assert 0 in row.loss_mask and 1 in row.loss_mask
        assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.loss_mask, strict=True) if not m)
        assert row.loss_mask[-1] == 1 and row.response_ids[-1] == 2  # ends on <|im_end|>
    served = {
        s["rollout_id"]: s["advantage"] for g in groups for s in g["samples"]
    }  # fmt: skip
    assert all(row.advantage == served[row.rollout_id] for row in rows)
    rewards = {r.task_index: r.reward for r in rows}
    assert rewards == {0: 1.0, 1: 1.0, 2: 0.0}


def test_advantage_without_the_servers_is_the_same_grpo_formula(real_groups: RealGroups) -> None:
    groups = real_groups.load()
    bare = copy.deepcopy(groups)
    for group in bare:
        for sample in group["samples"]:
            sample["advantage"] = None
    got = [r.advantage for r in training_samples(bare)]
    want = [r.advantage for r in training_samples(groups)]
    assert got == pytest.approx(want, abs=1e-9)


def test_per_call_rollouts_give_several_rows_sharing_the_reward(real_groups: RealGroups) -> None:
    groups = real_groups.load("per_call")
    rows = training_samples(groups)
    per_rollout: dict[str, list[int]] = {}
    for row in rows:
        per_rollout.setdefault(row.rollout_id, []).append(row.piece_index)
        assert row.n_pieces >= 2  # the tool call, then the answer
    assert len(per_rollout) == len(TASKS) * SAMPLES
    assert all(p == list(range(len(p))) for p in per_rollout.values())
    with pytest.raises(BridgeError, match="training samples in one rollout"):
        training_samples(groups, pieces="single")
    last = training_samples(groups, pieces="last")
    assert len(last) == len(TASKS) * SAMPLES and all(r.piece_index == 0 for r in last)


def test_unusable_rollouts_are_left_out_not_scored_zero(real_groups: RealGroups) -> None:
    groups = real_groups.load()
    lost = groups[0]["samples"][0]
    lost.update(usable=False, reward=None, termination_reason="worker_lost")
    rows = training_samples(groups)
    assert lost["rollout_id"] not in {r.rollout_id for r in rows}
    assert len(rows) == len(TASKS) * SAMPLES - 1


def test_misaligned_arrays_are_refused_naming_the_rollout(real_groups: RealGroups) -> None:
    groups = real_groups.load()
    piece = groups[1]["samples"][0]["trajectories"][0]
    piece["loss_mask"] = piece["loss_mask"][:-1]
    with pytest.raises(BridgeError, match=str(groups[1]["samples"][0]["rollout_id"])):
        training_samples(groups)
    groups = real_groups.load()
    piece = groups[1]["samples"][1]["trajectories"][0]
    piece["logprobs"] = piece["logprobs"] + [0.0]
    with pytest.raises(BridgeError, match="logprobs for"):
        training_samples(groups)
