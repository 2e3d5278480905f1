"""GRPO on polar_mq groups: group-normalised advantages and the training samples they weight.

Pure Python (no torch): the loop computes this in the project venv and ships the samples to the
learner. A group whose usable samples all got the same reward carries no signal (every advantage
is 0) and is skipped and counted, not trained on; unusable samples (infrastructure failures, no
reward) never get an advantage. The samples of a flat group still go to the learner, marked
`train=False`: it scores them without a gradient, so the trainer-engine logprob check covers
every batch, signal or not.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STD_EPS = 1e-6
"""Added to the group's standard deviation, so a nearly-constant group cannot blow up."""


@dataclass(frozen=True, slots=True)
class TrainSample:
    """One trajectory sample as the learner needs it (arrays as polar_mq stored them)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    """The engine's logprob of each response token (the behaviour policy)."""
    advantage: float
    train: bool = True
    """False: only measured (the logprob mismatch), not trained on (a group without signal)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class BatchSamples:
    """A batch's samples and what it said about itself (the per-step figures of the loop)."""

    samples: list[TrainSample] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    groups: int = 0
    zero_variance_groups: int = 0
    staleness: list[int] = field(default_factory=list)
    """Per group: the trainer's version minus the oldest version among the group's tokens."""
    no_logprobs: int = 0
    """Samples dropped because the engine returned no logprobs (nothing to correct with)."""


def group_advantages(rewards: Sequence[float]) -> list[float] | None:
    """(reward - mean) / (std + eps) per sample; None when the rewards do not vary."""
    if len(rewards) < 2:
        return None
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    if std == 0.0:
        return None
    return [(r - mean) / (std + STD_EPS) for r in rewards]


def usable_samples(group: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The group's samples that count: usable (no infrastructure failure) and rewarded."""
    return [s for s in group["samples"] if s["usable"] and s["reward"] is not None]


def has_signal(group: Mapping[str, Any]) -> bool:
    """Whether the group's usable samples got more than one reward (a GRPO advantage)."""
    return group_advantages([float(s["reward"]) for s in usable_samples(group)]) is not None


def batch_samples(
    batch: Sequence[Mapping[str, Any]], version: int, flat_limit: int | None = None
) -> BatchSamples:
    """The training samples of a batch of groups fetched with `include_trajectories`.

    `version`: the trainer's policy version when it took the batch (for the staleness figure).
    `flat_limit`: the samples of at most that many groups without signal go to the learner (for
    the entropy bonus and the mismatch figure); the others are counted, not sent. None: all."""
    out = BatchSamples()
    flat_left = len(batch) if flat_limit is None else flat_limit
    for group in batch:
        out.groups += 1
        versions = group.get("policy_versions")
        if versions:
            out.staleness.append(version - int(versions["min"]))
        usable = usable_samples(group)
        rewards = [float(s["reward"]) for s in usable]
        out.rewards.extend(rewards)
        advantages = group_advantages(rewards)
        if advantages is None:
            out.zero_variance_groups += 1
            if flat_left <= 0:
                continue
            flat_left -= 1
        train = advantages is not None
        for sample, advantage in zip(usable, advantages or [0.0] * len(usable), strict=True):
            for traj in sample.get("trajectories") or []:
                if traj["logprobs"] is None:
                    out.no_logprobs += 1
                    continue
                out.samples.append(
                    TrainSample(
                        prompt_ids=list(traj["prompt_ids"]),
                        response_ids=list(traj["response_ids"]),
                        loss_mask=list(traj["loss_mask"]),
                        logprobs=[float(x) for x in traj["logprobs"]],
                        advantage=advantage,
                        train=train,
                    )
                )
    return out
