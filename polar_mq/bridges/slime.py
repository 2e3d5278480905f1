"""slime bridge: a custom generate-rollout function that runs slime's prompts on polar_mq and
returns slime `Sample` groups. Written against THUDM/slime at commit 624b824a (2026-08-21);
slime is not on PyPI (the `slime` package there is another project), so its `Sample` is imported
from the caller's environment, or passed in.

Use with `--rollout-function-path polar_mq.bridges.slime.generate_rollout` and, in the
environment, `POLAR_MQ_URL`, `POLAR_MQ_API_KEY` (optional) and `POLAR_MQ_JOB` (optional, the
job's other fields as JSON: harness, evaluator, builder, sampling...). For each training step
slime asks for `rollout_batch_size` groups: this takes them from slime's data source (a group
is `n_samples_per_prompt` copies of one prompt `Sample`), runs one polar_mq job with one task
per prompt (the prompt as `instruction`, slime's `label` as `answer`), and fills each group's
samples from polar_mq's trajectories:

- `tokens` = prompt ids + response ids, `response_length` = len(response ids);
- `loss_mask` (response length): polar_mq's loss mask, 0 on tool output and template glue;
- `rollout_log_probs` (response length): the engine's logprobs;
- `reward`: polar_mq's reward; `status`: COMPLETED, or TRUNCATED when the agent ran out of
  turns, time or tokens, FAILED for an agent error;
- `weight_versions`: the policy versions that produced it, as strings;
- `rollout_id`: one int per polar_mq rollout, shared by the training samples of a rollout cut in
  several (per_call builder, prefix breaks), as slime wants for its loss averaging.

Rollouts that ended in an infrastructure failure carry no reward and are left out of their
group (slime's dynamic filters see a short group) rather than trained as reward 0.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from polar_mq.bridges.samples import BridgeError, Pieces, TrainingSample, training_samples

TRUNCATING = frozenset({"max_turns", "timeout", "token_budget"})
"""Agent outcomes where the trajectory stopped before the agent finished."""


def _sample_class() -> Any:
    from slime.utils.types import Sample

    return Sample


def _status(sample_cls: Any, row: TrainingSample) -> Any:
    if row.termination_reason in TRUNCATING:
        return sample_cls.Status.TRUNCATED
    if row.termination_reason == "agent_error":
        return sample_cls.Status.FAILED
    return sample_cls.Status.COMPLETED


def slime_sample(row: TrainingSample, rollout_number: int, sample_cls: Any, prompt: Any) -> Any:
    """slime's `Sample` of one training sample."""
    task = row.task
    return sample_cls(
        group_index=row.group_index,
        index=None,
        rollout_id=rollout_number,
        prompt=prompt,
        tokens=row.input_ids,
        response_length=len(row.response_ids),
        label=task.get("answer"),
        reward=row.reward,
        loss_mask=list(row.loss_mask),
        weight_versions=[str(v) for v in row.policy_versions],
        rollout_log_probs=row.logprobs,
        status=_status(sample_cls, row),
        metadata={
            "polar_group_id": row.group_id,
            "polar_rollout_id": row.rollout_id,
            "polar_piece_index": row.piece_index,
            "polar_advantage": row.advantage,
        },
    )


def slime_groups(
    groups: Sequence[Mapping[str, Any]],
    sample_cls: Any = None,
    prompts: Sequence[Any] | None = None,
    pieces: Pieces = "all",
) -> list[list[Any]]:
    """One list of slime `Sample`s per group, in the order of `groups`; `index` numbers every
    sample of the batch from 0. `prompts`: each group's slime prompt (default: the task's
    instruction)."""
    cls = sample_cls if sample_cls is not None else _sample_class()
    out: list[list[Any]] = [[] for _ in groups]
    numbers: dict[str, int] = {}
    for row in training_samples(groups, pieces):
        number = numbers.setdefault(row.rollout_id, len(numbers))
        prompt = prompts[row.group_index] if prompts is not None else row.task.get("instruction")
        out[row.group_index].append(slime_sample(row, number, cls, prompt))
    index = 0
    for group in out:
        for sample in group:
            sample.index = index
            index += 1
    return out


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"]
    if not users:
        raise BridgeError("a slime prompt of messages without a user message")
    return str(users[-1]["content"])


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's `--rollout-function-path` contract: `rollout_batch_size` groups of
    `n_samples_per_prompt` samples, run on polar_mq."""
    if evaluation:
        raise BridgeError("polar_mq's slime bridge makes training rollouts only (evaluation=True)")
    from polar_mq.bridges.source import run_groups
    from polar_mq.client import Client

    requested = data_source.get_samples(args.rollout_batch_size)
    tasks = []
    for group in requested:
        task: dict[str, Any] = {"instruction": _prompt_text(group[0].prompt)}
        if group[0].label is not None:
            task["answer"] = group[0].label
        tasks.append(task)
    job = json.loads(os.environ.get("POLAR_MQ_JOB") or "{}")
    url = os.environ.get("POLAR_MQ_URL", "http://127.0.0.1:8000")
    with Client(url, api_key=os.environ.get("POLAR_MQ_API_KEY")) as client:
        groups = run_groups(client, tasks, int(args.n_samples_per_prompt), job, "slime")
    samples = slime_groups(groups, type(requested[0][0]), prompts=[g[0].prompt for g in requested])
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput
    except ImportError:  # an older slime: the bare list is its legacy contract
        return samples
    return RolloutFnTrainOutput(samples=samples)
