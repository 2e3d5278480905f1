"""`polar-mq train` is `bash scripts/train`: the same flags, checks and messages (one parser)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from polar_mq.cli import app


def test_polar_mq_train_hands_every_flag_to_the_trainer() -> None:
    shown = CliRunner().invoke(app, ["train", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "usage: polar-mq train" in shown.output
    for flag in ("--steps", "--seed", "--max-staleness", "--out"):
        assert flag in shown.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--samples", "1"], "--samples must be at least 2"),
        (["--temperature", "0"], "--temperature must be positive"),
        (["--entropy-coef", "-0.1"], "--entropy-coef must not be negative"),
        (["--entropy-target", "-1"], "--entropy-target must not be negative"),
        (["--entropy-target", "1", "--entropy-max", "0"], "--entropy-max must be positive"),
        (["--entropy-min", "0.2"], "--entropy-min must be within [0, --entropy-max]"),
        (["--resample-flat", "-1"], "--resample-flat must not be negative"),
        (["--kl-coef", "-0.1"], "--kl-coef must not be negative"),
    ],
)
def test_bad_flags_get_the_trainers_message_not_a_traceback(flags: list[str], message: str) -> None:
    refused = CliRunner().invoke(app, ["train", *flags])
    assert refused.exit_code == 2
    assert message in refused.output
