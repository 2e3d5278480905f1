"""The per-step figures of a training run, its progress line and its JSON file."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    version: int
    """The policy version published after this step (the engine serves it from then on)."""
    groups: int
    samples: int
    mean_reward: float
    zero_variance_fraction: float
    """Groups whose usable samples all got one reward: no GRPO signal, not trained on."""
    tokens_trained: int
    staleness_mean: float
    staleness_max: int
    mismatch_mean: float | None
    """Mean |trainer logprob - engine logprob| over the batch's loss-mask tokens (those of
    groups without signal too), on the trainer's weights before the step."""
    mismatch_max: float | None
    mismatch_tokens: int
    loss: float
    grad_norm: float | None
    clipped_tokens: int
    entropy_mean: float | None
    """Mean entropy of the policy's next-token distribution over the batch's loss-mask tokens,
    before the step: falls as the policy narrows (and groups lose their variance)."""
    entropy_coef: float
    """The entropy bonus's coefficient this step used (steered by `--entropy-target`)."""
    kl_mean: float | None
    """The policy's KL to the base weights per stepped loss-mask token, before the step (with
    `--kl-coef` only)."""
    wait_s: float
    """Waiting for the batch (rollouts not ready yet)."""
    train_s: float
    publish_s: float
    """Save, pause, drain, load into the engines, resume."""

    def progress(self) -> str:
        gap = "-"
        if self.mismatch_mean is not None and self.mismatch_max is not None:
            gap = f"{self.mismatch_mean:.4f}/{self.mismatch_max:.3f}"
        return (
            f"step {self.step:3d} -> v{self.version}: reward {self.mean_reward:.3f}"
            f" | groups {self.groups} zero-var {self.zero_variance_fraction:.2f}"
            f" | tokens {self.tokens_trained:5d}"
            f" | stale {self.staleness_mean:.1f}/{self.staleness_max}"
            f" | |dlogp| mean/max {gap}"
            f" | entropy {'-' if self.entropy_mean is None else f'{self.entropy_mean:.3f}'}"
            f" coef {self.entropy_coef:.4f}"
            + ("" if self.kl_mean is None else f" kl {self.kl_mean:.4f}")
            + f" | wait {self.wait_s:5.1f}s train {self.train_s:5.1f}s"
            f" publish {self.publish_s:4.1f}s"
        )


def mean_or(values: list[float], default: float = 0.0) -> float:
    return statistics.fmean(values) if values else default


def write_run(path: Path, run: dict[str, Any], steps: list[StepRecord]) -> None:
    """The run's summary and every step, rewritten after each step (a crash keeps the curve)."""
    body = {**run, "steps": [asdict(s) for s in steps]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)
