"""The held-out score: the eval split as its own job, greedy (temperature 0), one sample each.

Run before the first step and after the last one, on whatever policy version the engines serve
then (the proxy sends every call to the current adapter, whatever model name the agent asks)."""

from __future__ import annotations

from typing import Any

from polar_mq.client import Client
from polar_mq.training.grpo import usable_samples
from polar_mq.training.loop import AGENT, REWARD
from polar_mq.training.metrics import mean_or


def evaluate(client: Client, tasks: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """{"mean_reward", "n", "version", "job_id", "replies"} of the eval split."""
    version = int(client.policy()["version"])
    job = client.submit(
        tasks,
        samples_per_task=1,
        harness={"type": "command", "command": AGENT},
        evaluator=REWARD,
        sampling={"temperature": 0.0, "max_tokens": max_tokens},
        timeouts={"agent_s": 600},
        metadata={"trainer": "polar_mq.training", "eval": True},
    )
    job_id = str(job.job_id)
    client.wait(job_id, progress=False, timeout=3600)
    rewards: list[float] = []
    replies: list[dict[str, Any]] = []
    for group in client.results(job_id, complete_only=False):
        for sample in usable_samples(group):
            rewards.append(float(sample["reward"]))
            replies.append({"task": group["task"]["instruction"], "reward": sample["reward"]})
    return {
        "mean_reward": mean_or(rewards),
        "n": len(rewards),
        "version": version,
        "job_id": job_id,
        "replies": replies,
    }
