"""TRL bridge: polar_mq groups as TRL's rollouts (GRPOTrainer `rollout_func`, AsyncGRPOTrainer
rollout worker). Written against trl 1.16.0.

Two entry points, one per TRL trainer:

- `make_rollout_func(client, job)` -> the `rollout_func(prompts, trainer)` of `GRPOTrainer`.
  TRL hands it the prompts of one generation batch (each repeated `num_generations` times in a
  row, as its RepeatSampler draws them); it runs one polar_mq job with one task per distinct
  prompt and `num_generations` samples each, and returns one completion per input:
  `prompt_ids`, `completion_ids`, `logprobs` (the engine's), `env_mask` (polar_mq's loss mask:
  TRL zeroes tool output with it) and `polar_reward`, which `polar_reward` (pass it in
  `reward_funcs`) gives back as the reward. TRL then computes its own group advantages from it.
- `PolarMQRolloutWorker(client, job_id)` -> the `rollout_worker` of the experimental
  `AsyncGRPOTrainer`: a thread leases complete groups from a running job and puts one TRL
  `RolloutSample` per training sample on `rollout_buffer` (prompt and response as one sequence,
  the loss mask and logprobs over the response, zeros over the prompt, polar_mq's GRPO
  advantage). Groups are acknowledged once their samples are queued; `update_model_version`
  records the trainer's new version as polar_mq's policy version (so staleness is judged and
  calls are stamped with it).

`rollout_output` and `rollout_samples` are the pure conversions under both; trl, torch and
numpy are imported inside the functions that need them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from polar_mq.bridges.samples import (
    BridgeError,
    Pieces,
    by_group,
    oldest_version,
    training_samples,
)
from polar_mq.bridges.source import run_groups

if TYPE_CHECKING:
    from polar_mq.client import Client

TaskForPrompt = Callable[[Any], Mapping[str, Any]]
"""Turns one TRL prompt (a string or a list of chat messages) into a polar_mq task."""


def prompt_task(prompt: Any) -> dict[str, Any]:
    """The default task of a prompt: its text (a chat prompt: its last user message)."""
    if isinstance(prompt, str):
        return {"instruction": prompt}
    users = [m for m in prompt if m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise BridgeError("a chat prompt needs a last user message with text content")
    return {"instruction": users[-1]["content"]}


def rollout_output(
    groups: Sequence[Mapping[str, Any]], pieces: Pieces = "single"
) -> dict[str, Any]:
    """`GRPOTrainer`'s rollout_func answer for `groups`: one entry per rollout, group by group.

    Every group must have all its rollouts usable: TRL's batch needs exactly one completion per
    input (an incomplete group is an error naming it).
    """
    out: dict[str, list[Any]] = {
        "prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
        "polar_reward": [], "polar_advantage": [], "polar_rollout_id": [],
    }  # fmt: skip
    for group in groups:
        rows = training_samples([group], pieces)
        if len({r.rollout_id for r in rows}) != len(group["samples"]):
            raise BridgeError(
                f"group {group['group_id']}: {len(rows)} usable of {len(group['samples'])} "
                "rollouts; TRL's rollout_func needs every one (use the AsyncGRPO worker, which "
                "takes short groups)"
            )
        for row in rows:
            out["prompt_ids"].append(row.prompt_ids)
            out["completion_ids"].append(row.response_ids)
            # None where the engine gave no logprob: TRL reads it as NaN, no IS correction there
            out["logprobs"].append(row.logprobs or [None] * len(row.response_ids))
            out["env_mask"].append(row.loss_mask)
            out["polar_reward"].append(row.reward)
            out["polar_advantage"].append(row.advantage)
            out["polar_rollout_id"].append(row.rollout_id)
    return out


def polar_reward(
    completions: Sequence[Any], polar_reward: Sequence[float], **_: Any
) -> list[float]:
    """A TRL reward function giving polar_mq's reward (the `polar_reward` field of the rollout)."""
    if len(polar_reward) != len(completions):
        raise BridgeError(f"{len(polar_reward)} rewards for {len(completions)} completions")
    return [float(r) for r in polar_reward]


def _blocks(prompts: Sequence[Any], size: int) -> list[Any]:
    """The distinct prompts of a batch where each is repeated `size` times in a row."""
    if size < 1 or len(prompts) % size:
        raise BridgeError(f"{len(prompts)} prompts do not split into groups of {size}")
    heads = list(prompts[::size])
    for i, head in enumerate(heads):
        if any(p != head for p in prompts[i * size : (i + 1) * size]):
            raise BridgeError(
                f"prompts {i * size}..{(i + 1) * size - 1} are not one prompt repeated"
            )
    return heads


def make_rollout_func(
    client: Client,
    job: Mapping[str, Any] | None = None,
    task_for_prompt: TaskForPrompt = prompt_task,
    pieces: Pieces = "single",
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A `rollout_func` for `trl.GRPOTrainer` that runs each generation batch on polar_mq.

    `job`: the job fields besides tasks (harness, evaluator, builder, sampling, timeouts).
    `task_for_prompt`: builds the task of a prompt (e.g. adds the `answer` the evaluator needs).
    """

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        training = bool(getattr(getattr(trainer, "model", None), "training", True))
        size = trainer.num_generations if training else trainer.num_generations_eval
        tasks = [dict(task_for_prompt(p)) for p in _blocks(prompts, int(size))]
        return rollout_output(run_groups(client, tasks, int(size), job), pieces)

    return rollout_func


def rollout_samples(
    groups: Sequence[Mapping[str, Any]], base_version: int = 0, pieces: Pieces = "all"
) -> list[Any]:
    """TRL `RolloutSample`s of `groups`: one per training sample of each usable rollout.

    `input_ids` is prompt + response; `completion_mask` and `old_log_probs` span it, 0 over
    the prompt and polar_mq's loss mask and logprobs over the response. `model_version` is the
    sample's oldest policy version minus `base_version` (the polar_mq version the trainer's
    version 0 stands for); `group_id` numbers the groups of this call from 0.
    """
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    samples: list[Any] = []
    for rows in by_group(training_samples(groups, pieces)):
        rewards = [r.reward for r in rows]
        mean = sum(rewards) / len(rewards)
        std = (sum((x - mean) ** 2 for x in rewards) / len(rewards)) ** 0.5
        for row in rows:
            prompt_zeros = [0] * len(row.prompt_ids)
            logprobs = row.logprobs or [0.0] * len(row.response_ids)
            samples.append(
                RolloutSample(
                    prompt=[{"role": "user", "content": str(row.task.get("instruction", ""))}],
                    completion=[],
                    input_ids=np.asarray(row.input_ids, dtype=np.int64),
                    completion_mask=np.asarray(prompt_zeros + row.loss_mask, dtype=np.int64),
                    old_log_probs=np.asarray(
                        [0.0] * len(prompt_zeros) + logprobs, dtype=np.float32
                    ),
                    advantage=float(row.advantage),
                    model_version=oldest_version(row, base_version) - base_version,
                    group_id=row.group_index,
                    metrics={"reward": row.reward, "reward_std": std},
                    enqueued_at=time.time(),
                )
            )
    return samples


class PolarMQRolloutWorker:
    """`AsyncGRPOTrainer(rollout_worker=...)`: TRL's rollout worker protocol, fed by one job.

    Submit the job with `staleness={"max_staleness": S, "batch_size": B}` so polar_mq bounds
    how far generation runs ahead; the trainer's own `max_staleness` then drops nothing.
    """

    def __init__(
        self,
        client: Client,
        job_id: str,
        consumer: str = "trl-async-grpo",
        groups_per_lease: int = 4,
        lease_s: float = 600.0,
        publish_versions: bool = True,
        buffer_size: int = 0,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.consumer = consumer
        self.groups_per_lease = groups_per_lease
        self.lease_s = lease_s
        self.publish_versions = publish_versions
        self.rollout_buffer: queue.Queue[Any] = queue.Queue(maxsize=buffer_size)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.base_version = 0
        self.groups_done = 0
        self.finished = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._last_put = time.monotonic()
        self._thread: threading.Thread | None = None
        self._next_group = 0

    def start(self) -> None:
        """Read polar_mq's current version (the trainer's 0), then lease in a thread."""
        self.base_version = int(self.client.policy()["version"])
        self._thread = threading.Thread(target=self._run, name="polar-mq-rollouts", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                answer = self.client.lease_groups(
                    self.job_id, self.consumer, max_groups=self.groups_per_lease,
                    lease_s=self.lease_s, wait_s=5.0, include_trajectories=True,
                    advantages="grpo",
                )  # fmt: skip
                groups = answer["groups"]
                if groups:
                    self._queue(groups)
                    ids = [g["delivery"]["delivery_id"] for g in groups]
                    self.client.ack_groups(self.job_id, self.consumer, ids)
                if answer.get("done"):
                    break
        except BaseException as exc:  # surfaced to the trainer by check_health
            self._error = exc
        finally:
            self.finished.set()

    def _queue(self, groups: list[dict[str, Any]]) -> None:
        samples = rollout_samples(groups, self.base_version)
        for sample in samples:  # group ids unique over the run, not per lease
            sample.group_id += self._next_group
        self._next_group += len(groups)
        for sample in samples:
            self.rollout_buffer.put(sample)
        self.groups_done += len(groups)
        self._last_put = time.monotonic()
        self.metrics_queue.put({"polar_mq/groups": float(len(groups))})

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def update_model_version(self, model_version: int) -> None:
        """The trainer's weights are live at `model_version`: record it as polar_mq's version."""
        if self.publish_versions:
            self.client.set_policy(self.base_version + model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError(f"polar_mq rollout worker failed: {self._error!r}") from self._error
        if self.finished.is_set():
            raise RuntimeError(f"polar_mq job {self.job_id} has no more groups")
        idle = time.monotonic() - self._last_put
        if idle > stale_after_s:
            raise RuntimeError(f"no polar_mq group for {idle:.0f}s (job {self.job_id})")
