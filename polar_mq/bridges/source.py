"""Run a batch of prompts through polar_mq and get their complete groups back, in prompt order.

The synchronous trainers' hooks (TRL's `rollout_func`, slime's `generate_rollout`) hand over a
batch of prompts and want every completion of every prompt before they return. polar_mq makes
and scores the groups as a job; this submits one job per batch and reads its groups through the
group lease (each group acknowledged once read), then puts them back in the prompts' order,
since polar_mq hands groups out in completion order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from polar_mq.bridges.samples import BridgeError

if TYPE_CHECKING:
    from polar_mq.client import Client


def run_groups(
    client: Client,
    tasks: Sequence[Mapping[str, Any]],
    samples_per_task: int,
    job: Mapping[str, Any] | None = None,
    consumer: str = "bridge",
    lease_s: float = 600.0,
) -> list[dict[str, Any]]:
    """Submit `tasks` x `samples_per_task` rollouts, wait for every group, return them in task
    order with their trajectories and GRPO advantages.

    `job`: the other fields of the job (harness, evaluator, builder, sampling, timeouts, ...).
    A group polar_mq withheld as stale never comes: that is an error here, as the caller's
    batch would be short of it.
    """
    spec = dict(job or {})
    submission = client.submit(list(tasks), samples_per_task=samples_per_task, **spec)
    got: dict[int, dict[str, Any]] = {}
    batches = client.stream_groups(
        submission.job_id, batch_size=max(1, len(tasks)), consumer=consumer, lease_s=lease_s,
        ack="auto", include_trajectories=True, advantages="grpo",
    )  # fmt: skip
    for batch in batches:
        for group in batch:
            got[int(group["task_index"])] = group
    missing = [i for i in range(len(tasks)) if i not in got]
    if missing:
        raise BridgeError(
            f"job {submission.job_id}: no complete group for task(s) {missing} "
            "(withheld as stale, or the job was cancelled)"
        )
    return [got[i] for i in range(len(tasks))]
