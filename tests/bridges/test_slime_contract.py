"""The slime bridge: slime `Sample` groups from real polar_mq groups, and the custom
generate-rollout function run against a live stack as slime calls it.

Against the stand-in of slime's `Sample` (tests/bridges/slime_sample.py: slime is not on PyPI).
slime's training itself (Megatron, SGLang, GPUs) is not run here.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest

from polar_mq.bridges import BridgeError
from polar_mq.bridges.samples import training_samples
from polar_mq.bridges.slime import generate_rollout, slime_groups
from tests.bridges.conftest import SAMPLES, TASKS, RealGroups
from tests.bridges.slime_sample import Sample

pytestmark = pytest.mark.e2e


def test_groups_become_slime_samples_with_aligned_tokens(real_groups: RealGroups) -> None:
    groups = real_groups.load()
    out = slime_groups(groups, Sample)
    rows = training_samples(groups)
    assert [len(g) for g in out] == [SAMPLES] * len(TASKS)
    flat = [s for g in out for s in g]
    assert [s.index for s in flat] == list(range(len(flat)))
    for sample, row in zip(flat, rows, strict=True):
        assert isinstance(sample, Sample)
        assert sample.tokens == row.prompt_ids + row.response_ids
        assert sample.response_length == len(row.response_ids)
        assert sample.tokens[-sample.response_length :] == row.response_ids
        assert sample.loss_mask == row.loss_mask and len(sample.loss_mask) == sample.response_length
        assert sample.rollout_log_probs == row.logprobs
        assert sample.reward == row.reward and sample.status is Sample.Status.COMPLETED
        assert sample.group_index == row.group_index and sample.weight_versions == ["0"]
        assert sample.label == TASKS[row.task_index]["answer"]
        assert sample.prompt == TASKS[row.task_index]["instruction"]
    assert len({s.rollout_id for s in flat}) == len(flat)


def test_a_rollout_cut_in_several_samples_shares_its_rollout_id(real_groups: RealGroups) -> None:
    out = slime_groups(real_groups.load("per_call"), Sample)
    flat = [s for g in out for s in g]
    by_rollout: dict[int | None, set[str]] = {}
    for sample in flat:
        by_rollout.setdefault(sample.rollout_id, set()).add(sample.metadata["polar_rollout_id"])
    assert len(by_rollout) == len(TASKS) * SAMPLES < len(flat)
    assert all(len(ids) == 1 for ids in by_rollout.values())


class DataSource:
    """slime's data source contract: `get_samples(n)` -> n groups of prompt Samples."""

    def __init__(self, n_samples_per_prompt: int) -> None:
        self.n = n_samples_per_prompt
        self.asked: list[int] = []

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        self.asked.append(num_samples)
        return [
            [Sample(prompt=t["instruction"], label=t["answer"], index=i) for _ in range(self.n)]
            for i, t in enumerate(TASKS[:num_samples])
        ]


def test_generate_rollout_runs_slimes_prompts_on_polar_mq(
    real_groups: RealGroups, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_MQ_URL", real_groups.url)
    monkeypatch.setenv("POLAR_MQ_JOB", '{"harness": {"type": "reference"}, "builder": '
                       '"prefix_merge", "evaluator": "exact_match"}')  # fmt: skip
    args = Namespace(rollout_batch_size=len(TASKS), n_samples_per_prompt=SAMPLES)
    source = DataSource(SAMPLES)
    out: Any = generate_rollout(args, 7, source)  # slime not importable: the legacy bare list
    assert source.asked == [len(TASKS)]
    assert [len(g) for g in out] == [SAMPLES] * len(TASKS)
    assert [[s.reward for s in g] for g in out] == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    assert all(isinstance(s, Sample) and s.loss_mask and 0 in s.loss_mask for g in out for s in g)
    assert [g[0].prompt for g in out] == [t["instruction"] for t in TASKS]
    with pytest.raises(BridgeError, match="evaluation"):
        generate_rollout(args, 7, source, evaluation=True)
