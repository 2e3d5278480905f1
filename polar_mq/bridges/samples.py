"""One reading of polar_mq groups for every trainer bridge: the samples that train, checked.

A group (as `Client.stream_groups(..., include_trajectories=True)` or `results` returns it) holds
one task's rollouts; each rollout holds one or more *training samples* (`trajectories`: one per
LLM call with the `per_call` builder, one per unbroken chain with `prefix_merge`). A trainer wants
flat rows of `prompt_ids`, `response_ids`, a loss mask and the engine's logprobs aligned with the
response, plus the rollout's reward and group-relative advantage. This module makes those rows
and refuses what would train wrongly instead of passing it on:

- rollouts that are not `usable` (infrastructure failures, unscored) carry no reward: they are
  left out, never trained as reward 0 (see docs/results.md);
- a training sample whose `loss_mask` or `logprobs` is not as long as its `response_ids`, or
  with an empty response, is an error naming the rollout: a shifted mask trains on the wrong
  tokens silently, which is worse than stopping.

The advantage is the one polar_mq computed (`advantages="grpo"` on the lease or results call),
else the same formula from the group's `mean_reward` / `std_reward`: `(r - mean) / (std + 1e-6)`
over the usable samples, population standard deviation (polar_mq.jobs.group_stats). It is
recomputed here rather than imported because that module pulls in the database models, which a
trainer's environment need not have.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

GRPO_EPS = 1e-6
"""As polar_mq.jobs.group_stats.GRPO_EPS: a group with one reward for all gets advantage 0."""

Pieces = Literal["all", "last", "single"]
"""What to do with a rollout of several training samples: keep `all` (each a row with the
rollout's reward), keep the `last` one, or require a `single` one (an error otherwise)."""


class BridgeError(ValueError):
    """polar_mq data a trainer cannot take as it is (misaligned arrays, a short group)."""


@dataclass(frozen=True, slots=True)
class TrainingSample:
    """One row for a trainer: one training sample of one usable rollout."""

    group_id: str
    """`<job id>:<task index>`: the GRPO group."""
    group_index: int
    """Position of the group in the batch it was read from (0, 1, ...)."""
    task_index: int
    task: Mapping[str, Any]
    rollout_id: str
    sample_index: int
    """The rollout's index within its group."""
    piece_index: int
    """The training sample's index within its rollout."""
    n_pieces: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the model sampled, 0 on tool output and template glue; as long as
    `response_ids`."""
    logprobs: list[float] | None
    """The engine's logprob of each response token (0.0 where the mask is 0), or None when the
    engine gave none."""
    reward: float
    advantage: float
    termination_reason: str | None
    policy_versions: list[int] = field(default_factory=list)
    """Distinct policy versions that produced this sample (oldest first)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The builder's metadata of this sample."""

    @property
    def n_calls(self) -> int:
        """LLM calls merged into this sample (1 for per_call)."""
        return len(self.meta.get("seqs") or ()) or 1

    @property
    def input_ids(self) -> list[int]:
        """Prompt then response: the sequence a trainer forwards."""
        return self.prompt_ids + self.response_ids


def _advantage(sample: Mapping[str, Any], group: Mapping[str, Any], reward: float) -> float:
    given = sample.get("advantage")
    if given is not None:
        return float(given)
    mean, std = group.get("mean_reward"), group.get("std_reward")
    if mean is None or std is None:
        raise BridgeError(f"group {group.get('group_id')} has no reward statistics")
    return (reward - float(mean)) / (float(std) + GRPO_EPS)


def _versions(meta: Mapping[str, Any]) -> list[int]:
    raw = meta.get("policy_versions")
    if not isinstance(raw, list):
        return []
    return sorted({v for v in raw if isinstance(v, int) and not isinstance(v, bool)})


def _checked(piece: Mapping[str, Any], where: str) -> tuple[list[int], list[int], list[int]]:
    prompt = [int(t) for t in piece["prompt_ids"]]
    response = [int(t) for t in piece["response_ids"]]
    mask = [int(m) for m in piece["loss_mask"]]
    if not response:
        raise BridgeError(f"{where}: empty response_ids")
    if len(mask) != len(response):
        raise BridgeError(
            f"{where}: loss_mask has {len(mask)} entries for {len(response)} response tokens"
        )
    if any(m not in (0, 1) for m in mask):
        raise BridgeError(f"{where}: loss_mask holds values other than 0 and 1")
    logprobs = piece.get("logprobs")
    if logprobs is not None and len(logprobs) != len(response):
        raise BridgeError(f"{where}: {len(logprobs)} logprobs for {len(response)} response tokens")
    return prompt, response, mask


def _pieces_of(sample: Mapping[str, Any], pieces: Pieces, where: str) -> list[Mapping[str, Any]]:
    own: Sequence[Mapping[str, Any]] | None = sample.get("trajectories")
    if own is None:
        raise BridgeError(f"{where}: no trajectories (ask with include_trajectories=True)")
    if not own:
        raise BridgeError(f"{where}: the rollout has no training sample")
    if pieces == "single" and len(own) != 1:
        raise BridgeError(
            f"{where}: {len(own)} training samples in one rollout, where this trainer takes one "
            "per rollout; use the prefix_merge builder (one sample per unbroken chain) or the "
            "bridge's pieces='last'"
        )
    return [own[-1]] if pieces == "last" else list(own)


def training_samples(
    groups: Iterable[Mapping[str, Any]], pieces: Pieces = "all"
) -> list[TrainingSample]:
    """The training rows of `groups`, in group order, then rollout order, then sample order.

    Rollouts that are not usable are left out (their group keeps its other samples).
    """
    rows: list[TrainingSample] = []
    for group_index, group in enumerate(groups):
        for sample in sorted(group["samples"], key=lambda s: int(s["sample_index"])):
            if not sample.get("usable") or sample.get("reward") is None:
                continue
            reward = float(sample["reward"])
            if not math.isfinite(reward):
                raise BridgeError(f"rollout {sample['rollout_id']}: reward {reward}")
            where = f"rollout {sample['rollout_id']}"
            own = _pieces_of(sample, pieces, where)
            for piece_index, piece in enumerate(own):
                prompt, response, mask = _checked(piece, f"{where} sample {piece_index}")
                logprobs = piece.get("logprobs")
                meta = piece.get("meta") or {}
                rows.append(
                    TrainingSample(
                        group_id=str(group["group_id"]),
                        group_index=group_index,
                        task_index=int(group["task_index"]),
                        task=group.get("task") or {},
                        rollout_id=str(sample["rollout_id"]),
                        sample_index=int(sample["sample_index"]),
                        piece_index=piece_index,
                        n_pieces=len(own),
                        prompt_ids=prompt,
                        response_ids=response,
                        loss_mask=mask,
                        logprobs=None if logprobs is None else [float(x) for x in logprobs],
                        reward=reward,
                        advantage=_advantage(sample, group, reward),
                        termination_reason=sample.get("termination_reason"),
                        policy_versions=_versions(meta),
                        meta=meta,
                    )
                )
    return rows


def by_group(rows: Iterable[TrainingSample]) -> list[list[TrainingSample]]:
    """`rows` split into their groups, in the order the groups first appear."""
    out: dict[str, list[TrainingSample]] = {}
    for row in rows:
        out.setdefault(row.group_id, []).append(row)
    return list(out.values())


def oldest_version(row: TrainingSample, default: int = 0) -> int:
    """The policy version of the sample's oldest token (what staleness is judged on)."""
    return row.policy_versions[0] if row.policy_versions else default
