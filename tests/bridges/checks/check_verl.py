"""verl's side of the verl bridge contract, run in the trainers' venv (verl 0.9.1, torch, cpu).

    check_verl.py GROUPS.json

Builds verl's real `AgentLoopOutput`s and `DataProto` from polar_mq groups, checks them with
verl's own code (`AgentLoopOutput.as_dict`, `DataProto.check_consistency`, chunking, and the
GRPO outcome advantage of `verl.trainer.ppo.core_algos`, which groups by `uid` and reads the
reward from `rm_scores`), then prints a JSON report as its last stdout line.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(path: str) -> dict[str, Any]:
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from polar_mq.bridges.samples import training_samples
    from polar_mq.bridges.verl import agent_loop_outputs, data_proto

    with open(path) as file:
        groups = json.load(file)
    rows = training_samples(groups)

    outputs = agent_loop_outputs(groups)
    assert len(outputs) == len(rows) > 0
    for output, row in zip(outputs, rows, strict=True):
        assert isinstance(output, AgentLoopOutput)
        tensors = output.as_dict()  # verl's own conversion of a loop's output
        assert tensors["prompts"].dtype == torch.int64
        assert tensors["responses"].tolist() == row.response_ids
        assert tensors["response_mask"].tolist() == row.loss_mask
        assert tensors["rollout_log_probs"].dtype == torch.float32
        assert tensors["rollout_log_probs"].shape == tensors["responses"].shape
        assert tensors["rm_scores"][-1].item() == row.reward
        assert tensors["rm_scores"][:-1].abs().sum().item() == 0
        assert output.extra_fields["polar_group_id"] == row.group_id

    prompt_length = max(len(r.prompt_ids) for r in rows) + 3
    response_length = max(len(r.response_ids) for r in rows) + 5
    proto = data_proto(groups, 0, prompt_length, response_length)
    assert isinstance(proto, DataProto)
    proto.check_consistency()
    batch = proto.batch
    n = len(rows)
    assert batch["input_ids"].shape == (n, prompt_length + response_length)
    assert batch["responses"].shape == batch["response_mask"].shape == (n, response_length)
    assert batch["rollout_log_probs"].dtype == torch.float32
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        assert batch["prompts"][i, prompt_length - p :].tolist() == row.prompt_ids  # left-padded
        assert batch["responses"][i, :r].tolist() == row.response_ids  # right-padded
        assert batch["response_mask"][i, :r].tolist() == row.loss_mask
        assert not batch["response_mask"][i, r:].any()
        assert batch["attention_mask"][i].sum().item() == p + r
        real = batch["attention_mask"][i].bool()
        assert batch["input_ids"][i][real].tolist() == row.prompt_ids + row.response_ids
        assert batch["position_ids"][i][real].tolist() == list(range(p + r))
        assert torch.allclose(batch["rollout_log_probs"][i, :r], torch.tensor(row.logprobs))
        assert batch["rm_scores"][i].sum().item() == row.reward
        assert batch["rm_scores"][i, r - 1].item() == row.reward
    assert list(proto.non_tensor_batch["uid"]) == [r.group_id for r in rows]

    # verl's GRPO on this batch: rewards from rm_scores, grouped by uid
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=batch["rm_scores"],
        response_mask=batch["response_mask"],
        index=proto.non_tensor_batch["uid"],
        norm_adv_by_std_in_grpo=False,
    )
    means: dict[str, list[float]] = {}
    for row in rows:
        means.setdefault(row.group_id, []).append(row.reward)
    for i, row in enumerate(rows):
        group = means[row.group_id]
        want = row.reward - sum(group) / len(group)
        got = advantages[i][batch["response_mask"][i].bool()]
        assert torch.allclose(got, torch.full_like(got, want), atol=1e-6), (i, got, want)

    halves = proto.chunk(2) if n % 2 == 0 else [proto]
    assert sum(len(h) for h in halves) == n
    return {
        "rows": n, "groups": len(groups), "prompt_length": prompt_length,
        "response_length": response_length, "trained_tokens": int(batch["response_mask"].sum()),
    }  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
