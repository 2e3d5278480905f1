"""`polar-mq train` is `bash scripts/train`: the same flags, checks and messages (one parser)."""

from __future__ import annotations

from typer.testing import CliRunner

from polar_mq.cli import app


def test_polar_mq_train_hands_every_flag_to_the_trainer() -> None:
    shown = CliRunner().invoke(app, ["train", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "usage: polar-mq train" in shown.output
    for flag in ("--steps", "--seed", "--max-staleness", "--out"):
        assert flag in shown.output


def test_bad_flags_get_the_trainers_message_not_a_traceback() -> None:
    refused = CliRunner().invoke(app, ["train", "--samples", "1"])
    assert refused.exit_code == 2
    assert "--samples must be at least 2" in refused.output


def test_a_temperature_must_be_positive_and_the_bonus_not_negative() -> None:
    zero = CliRunner().invoke(app, ["train", "--temperature", "0"])
    assert zero.exit_code == 2
    assert "--temperature must be positive" in zero.output
    negative = CliRunner().invoke(app, ["train", "--entropy-coef", "-0.1"])
    assert negative.exit_code == 2
    assert "--entropy-coef must not be negative" in negative.output


def test_an_entropy_target_must_be_positive() -> None:
    refused = CliRunner().invoke(app, ["train", "--entropy-target", "0"])
    assert refused.exit_code == 2
    assert "--entropy-target must be positive" in refused.output


def test_an_entropy_cap_must_be_positive() -> None:
    refused = CliRunner().invoke(app, ["train", "--entropy-target", "1", "--entropy-max", "0"])
    assert refused.exit_code == 2
    assert "--entropy-max must be positive" in refused.output


def test_resampling_cannot_be_negative() -> None:
    refused = CliRunner().invoke(app, ["train", "--resample-flat", "-1"])
    assert refused.exit_code == 2
    assert "--resample-flat must not be negative" in refused.output
