"""The training loop: consume → step → save → publish → ack, one batch of groups per step.

1. The job is submitted with `staleness: {max_staleness, batch_size}`: polar_mq generates at most
   that many steps' worth of groups ahead of the trainer's policy version.
2. A batch of complete groups is leased (`stream_groups`, manual acks, with trajectories).
3. GRPO advantages per group (`grpo.py`); groups without reward variance are skipped, counted
   (with `resample_flat`, more groups are leased in their place: `resampling`).
4. The learner recomputes the policy's logprobs on the stored ids under the stored loss mask,
   measures them against the engine's, and steps on the clipped importance-sampled loss.
5. The adapter is saved into `adapters/v{N}` and published as policy version N
   (`set_policy(N, adapter_path=...)`: the proxies pause, drain, load it into every engine and
   resume in that one call).
6. Only then are the groups acknowledged: a crash before means they are handed out again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_mq.client import Client, delivery_ids
from polar_mq.training.entropy_control import EntropyController
from polar_mq.training.grpo import batch_samples
from polar_mq.training.learner_client import Learner, LearnerError
from polar_mq.training.metrics import StepRecord, mean_or
from polar_mq.training.resampling import flat_fill, step_groups

AGENT = "{python} -m polar_mq.training.agent"
REWARD = {"name": "python", "callable": "polar_mq.training.tasks:reward"}


@dataclass(frozen=True, slots=True)
class LoopConfig:
    steps: int
    groups_per_step: int
    samples_per_group: int
    max_staleness: int = 1
    clip: float = 0.2
    temperature: float = 1.0
    entropy_coef: float = 0.0
    """The entropy bonus of the learner's loss (`learner.Policy.step`): keeps the policy from
    narrowing to one reply per task, where a group has no reward variance and so no gradient.
    With `entropy_target`, where the coefficient starts."""
    entropy_target: float | None = None
    """Steer the bonus's coefficient after every step toward this mean entropy (nats per
    token, `entropy_control`); None: the coefficient stays `entropy_coef`."""
    entropy_max: float = 0.05
    """The largest coefficient the steering may set."""
    entropy_min: float = 0.0
    """The coefficient's floor while the entropy is below the target (`entropy_control`: why
    there only)."""
    kl_coef: float = 0.0
    """The weight of the policy's KL to the base weights in the learner's loss
    (`learner.Policy.step`); 0: no anchor."""
    resample_flat: int = 0
    """Dynamic sampling (`resampling`): up to this many more groups per step, leased while fewer
    than `groups_per_step` of the step's groups have reward variance; 0: off."""
    max_tokens: int = 16
    seed: int | None = None
    """Seeds the rollouts' sampling: each rollout gets its own seed from this one, its group
    (the step and the group within it) and its sample index (`POLAR_AGENT_SEED`)."""
    lease_s: float = 900.0
    consumer: str = "polar-mq-trainer"


def submit_training_job(client: Client, config: LoopConfig, tasks: list[dict[str, Any]]) -> str:
    """One job holding every group the run will train on (the train split, cycled)."""
    per_step = config.groups_per_step + config.resample_flat
    # with resampling, groups generated ahead and not needed grow stale and are withheld: they
    # use up the job as much as the ones trained on (a run held 4 a step and ended at step 128)
    needed = config.steps * per_step * (2 if config.resample_flat else 1)
    cycled = [tasks[i % len(tasks)] for i in range(needed)]
    job = client.submit(
        cycled,
        samples_per_task=config.samples_per_group,
        harness={"type": "command", "command": AGENT},
        evaluator=REWARD,
        sampling=sampling(config),
        staleness={"max_staleness": config.max_staleness, "batch_size": per_step},
        timeouts={"agent_s": 600},
        metadata={"trainer": "polar_mq.training"},
    )
    return str(job.job_id)


FULL_DISTRIBUTION: dict[str, Any] = {
    "top_p": 1.0, "top_k": -1, "enforce": {"top_k": "override"}, "exact": True,
}  # fmt: skip
"""Sampling from the whole tempered distribution, whatever the agent asks: the learner scores
`log_softmax(logits / T)`, so an agent's `top_p` or `top_k` (renormalizing what the engine
samples from and reports), or its penalties, `min_p`, `logit_bias` or guided decoding (removed
by `exact`), would make every importance ratio compare two different policies."""


def sampling(config: LoopConfig) -> dict[str, Any]:
    """The training job's sampling, enforced by the proxy on every call: the temperature the
    learner scores at, over the whole distribution; its `seed` makes every rollout's sampling
    reproducible."""
    values: dict[str, Any] = {
        "temperature": config.temperature, "max_tokens": config.max_tokens, **FULL_DISTRIBUTION,
    }  # fmt: skip
    if config.seed is not None:
        values["seed"] = config.seed
    return values


def entropy_controller(config: LoopConfig) -> EntropyController | None:
    if config.entropy_target is None:
        return None
    return EntropyController(
        config.entropy_target,
        max_coef=config.entropy_max,
        min_coef=config.entropy_min,
        coef=config.entropy_coef,
    )


def publish(client: Client, learner: Learner, adapters: Path, version: int) -> dict[str, Any]:
    """Save the learner's adapter as `version` and make the engines serve it."""
    folder = adapters / f"v{version}"
    learner.call("save", dir=str(folder))
    update = client.set_policy(version, adapter_path=str(folder.resolve()))
    if not update.get("adapter_loaded"):
        raise LearnerError(f"adapter v{version} did not load everywhere: {update}")
    return update


def train(
    client: Client,
    learner: Learner,
    config: LoopConfig,
    job_id: str,
    adapters: Path,
    on_step: Callable[[StepRecord], None],
) -> list[StepRecord]:
    """Run `config.steps` steps on the job's groups; the records of the steps done."""
    version = int(client.policy()["version"])
    records: list[StepRecord] = []
    control = entropy_controller(config)
    coef = config.entropy_coef if control is None else control.coef  # the start, bounded
    batches = iter(client.stream_groups(
        job_id, batch_size=config.groups_per_step, consumer=config.consumer,
        lease_s=config.lease_s, ack="manual", include_trajectories=True,
    ))  # fmt: skip
    waited_from = time.monotonic()
    for step in range(config.steps):
        batch = step_groups(batches, config.groups_per_step, config.resample_flat)
        if batch is None:
            break
        got = time.monotonic()
        flat = flat_fill(batch, config.groups_per_step, config.resample_flat)
        data = batch_samples(batch, version, flat)
        figures: dict[str, Any] = {"tokens": 0, "loss": 0.0, "grad_norm": None,
                                   "clipped_tokens": 0, "mismatch_mean": None,
                                   "mismatch_max": None, "mismatch_tokens": 0,
                                   "entropy_mean": None, "kl_mean": None}  # fmt: skip
        if data.samples:
            samples = [s.as_json() for s in data.samples]
            answer = learner.call(
                "step", samples=samples, clip=config.clip, temperature=config.temperature,
                entropy_coef=coef, kl_coef=config.kl_coef,
            )  # fmt: skip
            figures.update(answer)
        trained = time.monotonic()
        publish(client, learner, adapters, version + 1)
        client.ack_groups(job_id, config.consumer, delivery_ids(batch))
        version += 1
        done = time.monotonic()
        record = StepRecord(
            step=step,
            version=version,
            groups=data.groups,
            samples=len(data.rewards),
            mean_reward=mean_or(data.rewards),
            zero_variance_fraction=data.zero_variance_groups / max(1, data.groups),
            tokens_trained=int(figures["tokens"]),
            staleness_mean=mean_or([float(s) for s in data.staleness]),
            staleness_max=max(data.staleness, default=0),
            mismatch_mean=figures["mismatch_mean"],
            mismatch_max=figures["mismatch_max"],
            mismatch_tokens=int(figures["mismatch_tokens"]),
            loss=float(figures["loss"]),
            grad_norm=figures["grad_norm"],
            clipped_tokens=int(figures["clipped_tokens"]),
            entropy_mean=figures["entropy_mean"],
            entropy_coef=coef,
            kl_mean=figures["kl_mean"],
            wait_s=round(got - waited_from, 2),
            train_s=round(trained - got, 2),
            publish_s=round(done - trained, 2),
        )
        records.append(record)
        on_step(record)
        if control is not None:
            coef = control.update(figures["entropy_mean"])
        waited_from = time.monotonic()
    return records
