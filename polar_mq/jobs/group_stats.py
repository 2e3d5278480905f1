"""Which samples of a group count, the group's reward statistics and GRPO advantages.

A sample is *usable* when its rollout is terminal, ended with an agent outcome (completed,
agent_error, timeout, max_turns, token_budget) and has a reward. Infrastructure failures
(runtime_error, backend_error, worker_lost, cancelled, stale) carry no reward: they are left out
of the mean, the standard deviation and the advantages instead of being counted as 0, which would
teach the policy that a crashed container is a wrong answer.

GRPO advantage (DeepSeekMath's group-relative normalisation): `(r - mean) / (std + GRPO_EPS)` over
the usable samples of one group, with the *population* standard deviation (divide by n, not
n - 1). Population std is defined for a group with a single usable sample (std 0, advantage 0)
and matches the mean/std a trainer computes over exactly the samples it trains on. GRPO_EPS keeps
a group where every sample got the same reward at advantage 0 instead of dividing by zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from polar_mq.models import RolloutStatus, TerminationReason

GRPO_EPS = 1e-6
ADVANTAGE_KINDS = ("grpo",)


def is_usable(status: str, termination_reason: str | None, reward: float | None) -> bool:
    """Terminal, ended by the agent (not the infrastructure), and scored."""
    return (
        status in RolloutStatus.TERMINAL
        and termination_reason not in TerminationReason.INFRASTRUCTURE
        and reward is not None
        and math.isfinite(reward)
    )


def public_reward(termination_reason: str | None, reward: float | None) -> float | None:
    """The reward a trainer sees: none at all for an infrastructure failure."""
    if termination_reason in TerminationReason.INFRASTRUCTURE:
        return None
    return reward


@dataclass(frozen=True, slots=True)
class RewardStats:
    n_usable: int
    mean: float | None
    std: float | None
    """Population standard deviation; None without usable samples."""


def reward_stats(usable_rewards: Sequence[float]) -> RewardStats:
    """Mean and population standard deviation of the usable rewards of one group."""
    n = len(usable_rewards)
    if n == 0:
        return RewardStats(0, None, None)
    mean = math.fsum(usable_rewards) / n
    variance = math.fsum((r - mean) ** 2 for r in usable_rewards) / n
    return RewardStats(n, mean, math.sqrt(variance))


def grpo_advantage(reward: float, stats: RewardStats) -> float:
    """`(reward - mean) / (std + GRPO_EPS)` for a usable sample of a group with these stats."""
    if stats.mean is None or stats.std is None:
        raise ValueError("advantage of a group without usable samples")
    return (reward - stats.mean) / (stats.std + GRPO_EPS)
