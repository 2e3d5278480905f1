"""verl bridge: polar_mq groups as verl's agent-loop outputs and its training batch (DataProto).
Written against verl 0.9.1.

- `agent_loop_outputs(groups)` -> one `AgentLoopOutput` per training sample: `prompt_ids`,
  `response_ids`, `response_mask` (polar_mq's loss mask: 1 on sampled tokens, 0 on tool
  output), `response_logprobs` (the engine's), `reward_score` (polar_mq's reward, so verl's
  reward loop is skipped, as for its SWE-agent loop) and `extra_fields` naming the polar_mq
  group, rollout and policy versions: what an `AgentLoopBase.run` returns, so an agent loop
  that runs its task on polar_mq returns `agent_loop_output(row)`.
- `data_proto(groups, pad_token_id, prompt_length, response_length)` -> the `DataProto` verl's
  agent-loop manager hands to the trainer, laid out as its `_postprocess` does: prompts
  left-padded to `prompt_length`, responses right-padded to `response_length`, `input_ids`,
  `attention_mask`, `position_ids`, `response_mask`, `rollout_log_probs`, `rm_scores` (the
  reward on the last response token), and `uid` = the polar_mq group id in `non_tensor_batch`,
  which is what verl's GRPO advantage groups by.

A sample longer than the lengths given is an error, not silently cut (verl's own loop cuts;
a cut here would drop the end of an agent's trajectory, where its reward is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polar_mq.bridges.samples import BridgeError, Pieces, TrainingSample, training_samples


def _extra(row: TrainingSample) -> dict[str, Any]:
    return {
        "polar_group_id": row.group_id, "polar_rollout_id": row.rollout_id,
        "polar_sample_index": row.sample_index, "polar_piece_index": row.piece_index,
        "polar_policy_versions": row.policy_versions, "polar_advantage": row.advantage,
    }  # fmt: skip


def agent_loop_output(row: TrainingSample) -> Any:
    """verl's `AgentLoopOutput` of one training sample."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    return AgentLoopOutput(
        prompt_ids=row.prompt_ids,
        response_ids=row.response_ids,
        response_mask=row.loss_mask,
        response_logprobs=row.logprobs,
        reward_score=row.reward,
        num_turns=2 * row.n_calls,  # the user turn, then assistant and tool turns
        metrics=AgentLoopMetrics(),
        extra_fields=_extra(row),
    )


def agent_loop_outputs(groups: Sequence[Mapping[str, Any]], pieces: Pieces = "all") -> list[Any]:
    """One `AgentLoopOutput` per training sample of each usable rollout of `groups`."""
    return [agent_loop_output(row) for row in training_samples(groups, pieces)]


def data_proto(
    groups: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    prompt_length: int,
    response_length: int,
    pieces: Pieces = "all",
) -> Any:
    """The `DataProto` batch of `groups` (one row per training sample), as verl's trainer reads
    the output of its agent loops."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    rows = training_samples(groups, pieces)
    if not rows:
        raise BridgeError("no usable training sample in these groups")
    n = len(rows)
    prompts = torch.full((n, prompt_length), pad_token_id, dtype=torch.int64)
    responses = torch.full((n, response_length), pad_token_id, dtype=torch.int64)
    prompt_attention = torch.zeros((n, prompt_length), dtype=torch.int64)
    response_attention = torch.zeros((n, response_length), dtype=torch.int64)
    response_mask = torch.zeros((n, response_length), dtype=torch.int64)
    logprobs = torch.zeros((n, response_length), dtype=torch.float32)
    rm_scores = torch.zeros((n, response_length), dtype=torch.float32)
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        if p > prompt_length or r > response_length:
            raise BridgeError(
                f"rollout {row.rollout_id}: {p} prompt / {r} response tokens exceed "
                f"prompt_length {prompt_length} / response_length {response_length}"
            )
        prompts[i, prompt_length - p :] = torch.tensor(row.prompt_ids)
        prompt_attention[i, prompt_length - p :] = 1
        responses[i, :r] = torch.tensor(row.response_ids)
        response_attention[i, :r] = 1
        response_mask[i, :r] = torch.tensor(row.loss_mask)
        if row.logprobs is not None:
            logprobs[i, :r] = torch.tensor(row.logprobs)
        rm_scores[i, r - 1] = row.reward
    attention_mask = torch.cat([prompt_attention, response_attention], dim=1)
    # as verl's compute_position_id_with_mask: positions count real tokens, 0 on left padding
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "rollout_log_probs": logprobs,
            "rm_scores": rm_scores,
        },
        batch_size=n,
    )
    non_tensor = {
        "uid": np.array([row.group_id for row in rows], dtype=object),
        "__num_turns__": np.array([2 * row.n_calls for row in rows], dtype=np.int32),
        "polar_rollout_id": np.array([row.rollout_id for row in rows], dtype=object),
        "polar_advantage": np.array([row.advantage for row in rows], dtype=np.float32),
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"metrics": []})
