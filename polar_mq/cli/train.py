"""`polar-mq train`: the CPU GRPO run of `bash scripts/train`, from the installed command.

Thin on purpose: every flag goes to `polar_mq.training.run` as it is, so the two commands cannot
drift apart (`polar-mq train --help` prints the trainer's own flags).
"""

from __future__ import annotations

import typer

TRAIN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def train(ctx: typer.Context) -> None:
    """GRPO with a LoRA on this CPU: SmolLM2-135M on the bundled vLLM, a held-out eval before
    and after, run.json and reward_curve.png (docs/training.md). Flags: `polar-mq train --help`."""
    from polar_mq.training.run import main

    raise typer.Exit(main(ctx.args, prog="polar-mq train"))
