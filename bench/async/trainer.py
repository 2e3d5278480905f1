"""The simulated trainer, run synchronously or asynchronously against the real API.

Both loops do the same per-step work on the same tasks: take B complete groups, compute their
GRPO advantages, "train" (sleep `train_s`), acknowledge them, then publish new weights:
`set_policy(v + 1, pause=True)` (new LLM calls wait while in-flight ones drain), "load" them
(sleep `load_s`), `resume_policy()`. Only how the groups are produced differs:

- synchronous: per step, submit a job of B tasks and wait for all of its groups; generation
  and training alternate.
- asynchronous: one job of every task with `staleness: {max_staleness: S, batch_size: B}`;
  polar_mq keeps up to S steps' worth of groups generating while the trainer trains, and
  never hands out a group whose oldest token is more than S versions old.

A group's staleness is the trainer's version when it consumes the group minus the oldest policy
version among its samples' tokens.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polar_mq.client import Client, delivery_ids

LEASE_S = 120.0


@dataclass
class Step:
    """One training step, as the trainer saw it."""

    version: int
    """Policy version the step trained with (the weights current when the batch arrived)."""
    groups: int
    samples: int
    wait_s: float
    """Waiting for the batch: the trainer idle, generation not done yet."""
    train_s: float
    update_s: float
    """set_policy(pause) + weight load + resume."""
    step_s: float
    staleness: list[int]
    drained_s: float = 0.0
    """How long set_policy waited for in-flight calls to finish."""
    drained_calls: int = 0
    """LLM calls in flight when the pause began (they finished on the old weights)."""
    set_policy_s: float = 0.0
    """The set_policy(pause=True) call: drain, then re-judging staleness and admitting groups."""
    resume_s: float = 0.0
    usable: int = 0
    """Samples with an agent outcome and a reward (the others carry no advantage)."""
    mean_reward: float | None = None


@dataclass
class LoopRun:
    name: str
    max_staleness: int | None
    steps: list[Step] = field(default_factory=list)
    wall_s: float = 0.0
    withheld_groups: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def groups(self) -> int:
        return sum(s.groups for s in self.steps)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.steps)

    @property
    def usable(self) -> int:
        return sum(s.usable for s in self.steps)

    @property
    def median_step_s(self) -> float:
        return statistics.median(s.step_s for s in self.steps) if self.steps else float("nan")

    @property
    def wait_share(self) -> float:
        return sum(s.wait_s for s in self.steps) / self.wall_s if self.wall_s else float("nan")

    @property
    def staleness(self) -> Counter[int]:
        return Counter(x for s in self.steps for x in s.staleness)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_staleness": self.max_staleness,
            "wall_s": round(self.wall_s, 3),
            "steps": len(self.steps),
            "groups": self.groups,
            "samples": self.samples,
            "usable_samples": self.usable,
            "median_step_s": round(self.median_step_s, 4),
            "wait_share": round(self.wait_share, 4),
            "withheld_groups": self.withheld_groups,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
            "per_step": [vars(s) for s in self.steps],
            "warnings": self.warnings,
        }


def grpo_advantages(group: Mapping[str, Any]) -> list[float]:
    """(reward - group mean) / (population std + 1e-6) over the group's usable samples."""
    rewards = [float(s["reward"]) for s in group["samples"] if s.get("usable")]
    if not rewards:
        return []
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def group_staleness(group: Mapping[str, Any], version: int) -> int | None:
    """Trainer version minus the oldest policy version among the group's tokens."""
    versions = group.get("policy_versions")
    return version - int(versions["min"]) if versions else None


class SimTrainer:
    """The trainer's side of one step: advantages, a simulated optimizer step, a weight update."""

    def __init__(self, client: Client, consumer: str, train_s: float, load_s: float) -> None:
        self.client = client
        self.consumer = consumer
        self.train_s = train_s
        self.load_s = load_s
        self.version = int(client.policy()["version"])

    def step(self, job_id: str, batch: Sequence[Mapping[str, Any]], wait_s: float) -> Step:
        started = time.perf_counter()
        staleness = [group_staleness(g, self.version) for g in batch]
        advantages = [grpo_advantages(g) for g in batch]  # what a trainer puts in its loss
        rewards = [float(s["reward"]) for g in batch for s in g["samples"] if s.get("usable")]
        time.sleep(self.train_s)
        self.client.ack_groups(job_id, self.consumer, delivery_ids(batch))
        trained = time.perf_counter()
        update = self.client.set_policy(self.version + 1, pause=True)
        paused = time.perf_counter()
        time.sleep(self.load_s)  # load the new weights into the inference engines
        loaded = time.perf_counter()
        self.client.resume_policy()
        self.version += 1
        done = time.perf_counter()
        return Step(
            version=self.version - 1,
            groups=len(batch),
            samples=sum(len(g["samples"]) for g in batch),
            wait_s=wait_s,
            train_s=trained - started,
            update_s=done - trained,
            step_s=wait_s + done - started,
            staleness=[s for s in staleness if s is not None],
            drained_s=float(update.get("waited_s") or 0.0),
            drained_calls=int(update.get("drained_calls") or 0),
            set_policy_s=paused - trained,
            resume_s=done - loaded,
            usable=sum(len(a) for a in advantages),
            mean_reward=statistics.fmean(rewards) if rewards else None,
        )


def _watchdog(client_factory: Callable[[], Client], job_ids: list[str], deadline_s: float) -> Any:
    """Cancel the run's jobs after `deadline_s` so a stuck stream ends instead of hanging."""

    def fire() -> None:
        with client_factory() as client:
            for job_id in job_ids:
                client.cancel(job_id)

    timer = threading.Timer(deadline_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def run_sync(
    client_factory: Callable[[], Client],
    spec: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]],
    tasks: Sequence[Mapping[str, Any]],
    batch_groups: int,
    train_s: float,
    load_s: float,
    timeout_s: float,
) -> LoopRun:
    """(a): per step, submit B groups, wait for all of them, train, publish new weights."""
    run = LoopRun("(a) synchronous", None)
    job_ids: list[str] = []
    timer = _watchdog(client_factory, job_ids, timeout_s)
    with client_factory() as client:
        trainer = SimTrainer(client, "bench-sync", train_s, load_s)
        started = time.perf_counter()
        for first in range(0, len(tasks), batch_groups):
            t0 = time.perf_counter()
            job = client.submit_spec(spec(tasks[first : first + batch_groups]))
            job_ids.append(job.job_id)
            want = len(tasks[first : first + batch_groups])
            batch: list[dict[str, Any]] = []
            # the job's groups, however the stream splits them (a batch may go out short when
            # the job finishes while it is being leased; the rest follows in the next one)
            for part in client.stream_groups(
                job.job_id, batch_size=want, consumer=trainer.consumer, lease_s=LEASE_S,
                ack="manual",
            ):  # fmt: skip
                batch += part
                if len(batch) >= want:
                    break
            if len(batch) < want:
                run.warnings.append(f"{run.name}: job {job.job_id}: {len(batch)}/{want} groups")
            if not batch:
                break
            run.steps.append(trainer.step(job.job_id, batch, time.perf_counter() - t0))
        run.wall_s = time.perf_counter() - started
    timer.cancel()
    return run


def run_async(
    client_factory: Callable[[], Client],
    spec: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]],
    tasks: Sequence[Mapping[str, Any]],
    batch_groups: int,
    max_staleness: int,
    train_s: float,
    load_s: float,
    timeout_s: float,
) -> LoopRun:
    """(b)/(c): one job with a staleness bound; consume B groups per step as they complete."""
    run = LoopRun(f"async, max_staleness {max_staleness}", max_staleness)
    job_ids: list[str] = []
    timer = _watchdog(client_factory, job_ids, timeout_s)
    with client_factory() as client:
        trainer = SimTrainer(client, f"bench-async-{max_staleness}", train_s, load_s)
        body = spec(tasks)
        body["staleness"] = {"max_staleness": max_staleness, "batch_size": batch_groups}
        started = t0 = time.perf_counter()
        job = client.submit_spec(body)
        job_ids.append(job.job_id)
        for batch in client.stream_groups(
            job.job_id, batch_size=batch_groups, consumer=trainer.consumer,
            lease_s=LEASE_S, ack="manual",
        ):  # fmt: skip
            run.steps.append(trainer.step(job.job_id, batch, time.perf_counter() - t0))
            t0 = time.perf_counter()
        run.wall_s = time.perf_counter() - started
        run.withheld_groups = sum(
            1 for g in client.results(job.job_id, complete_only=True) if g.get("stale")
        )
    timer.cancel()
    return run
