"""The reward curve of a training run as a PNG (matplotlib, in the learner's venv)."""

from __future__ import annotations

import json
from pathlib import Path

WINDOW = 5
"""Steps in the moving mean drawn over the noisy per-step reward."""


def plot_curve(json_path: str, png_path: str) -> None:
    """Mean reward per step (and the held-out eval before and after, when recorded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(Path(json_path).read_text())
    steps = run["steps"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [s["step"] for s in steps]
    ax.plot(xs, [s["mean_reward"] for s in steps], marker="o", ms=3, label="train mean reward")
    if len(steps) >= WINDOW:
        means = [s["mean_reward"] for s in steps]
        windows = [means[max(0, i - WINDOW + 1) : i + 1] for i in range(len(means))]
        ax.plot(xs, [sum(w) / len(w) for w in windows], label=f"moving mean ({WINDOW})")
    for key, style, color in (("eval_before", ":", "gray"), ("eval_after", "--", "green")):
        if run.get(key) is not None:
            value = run[key]["mean_reward"]
            label = f"held-out {key[5:]}: {value:.3f}"
            ax.axhline(value, linestyle=style, color=color, label=label)
    ax.set_xlabel("step (each publishes the next policy version)")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(run.get("title", "GRPO on polar_mq"))
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
