"""The steered entropy bonus (`entropy_control`), the loop that applies it step by step, and the
training job's sampling, which the proxy enforces over whatever the agent asks (unit tests: the
loop runs against stand-ins of the client and the learner)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_mq.capability.sampling import sampling_policy, validate_sampling
from polar_mq.proxy.sampling import enforce
from polar_mq.training.entropy_control import EntropyController
from polar_mq.training.loop import LoopConfig, sampling, train
from polar_mq.training.metrics import StepRecord


def test_the_coefficient_rises_below_the_target_and_fades_above_it() -> None:
    control = EntropyController(target=1.0, gain=0.01, max_coef=0.05)
    assert control.update(0.2) == pytest.approx(0.008)  # 0.8 nats short
    assert control.update(0.5) == pytest.approx(0.013)
    assert control.update(None) == pytest.approx(0.013)  # nothing measured: unchanged
    assert control.update(2.0) == pytest.approx(0.003)  # a nat over: it falls
    assert control.update(3.0) == 0.0  # never negative: a penalty would narrow it further


def test_the_coefficient_is_capped() -> None:
    control = EntropyController(target=2.0, gain=0.1, max_coef=0.05, coef=0.2)
    assert control.coef == 0.05  # a start above the cap is cut to it
    assert control.update(0.0) == 0.05


def test_the_floor_holds_below_the_target_only() -> None:
    """Above the target the bonus must fade to nothing: on an all-flat step it is the whole
    gradient, a full AdamW step whatever the coefficient. Below it, the coefficient starts at
    the floor instead of climbing from 0."""
    control = EntropyController(target=1.0, gain=0.01, max_coef=0.1, min_coef=0.03, coef=0.02)
    assert control.update(2.5) == pytest.approx(0.005)  # 1.5 nats over: it falls, floor or not
    assert control.update(3.0) == 0.0
    assert control.update(0.5) == 0.03  # below: raised to the floor at once (0.005 without it)
    assert control.update(0.0) == pytest.approx(0.04)  # and climbs from there
    assert control.update(1.5) == pytest.approx(0.035)  # above again: free to fall past it


def test_a_floor_above_the_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="min_coef"):
        EntropyController(target=1.0, max_coef=0.05, min_coef=0.06)


@pytest.mark.parametrize("field", ["target", "gain", "max_coef"])
def test_a_controller_needs_positive_settings(field: str) -> None:
    with pytest.raises(ValueError, match="positive"):
        EntropyController(**{"target": 1.0, field: 0.0})


class FakeLearner:
    """Answers `step` with the entropy of a script, one per step; records what it was sent."""

    def __init__(self, entropies: list[float]) -> None:
        self.entropies = entropies
        self.steps: list[dict[str, Any]] = []

    def call(self, op: str, **request: Any) -> dict[str, Any]:
        if op != "step":
            return {}
        self.steps.append(request)
        entropy = self.entropies[len(self.steps) - 1]
        return {"tokens": 2, "loss": 0.1, "grad_norm": 0.5, "clipped_tokens": 0,
                "mismatch_mean": 0.0, "mismatch_max": 0.0, "mismatch_tokens": 2,
                "entropy_mean": entropy}  # fmt: skip


class FakeClient:
    def __init__(self) -> None:
        self.version = 1
        self.acked: list[str] = []

    def policy(self) -> dict[str, Any]:
        return {"version": self.version}

    def stream_groups(self, job_id: str, **_: Any) -> Iterator[list[dict[str, Any]]]:
        n = 0
        while True:
            n += 1
            traj = {"prompt_ids": [1], "response_ids": [5, 6], "loss_mask": [1, 1],
                    "logprobs": [-1.0, -1.0]}  # fmt: skip
            samples = [{"usable": True, "reward": r, "trajectories": [traj]} for r in (0.0, 1.0)]
            yield [{"delivery": {"delivery_id": f"d{n}"}, "samples": samples}]

    def set_policy(self, version: int, adapter_path: str) -> dict[str, Any]:
        self.version = version
        return {"adapter_loaded": True}

    def ack_groups(self, job_id: str, consumer: str, ids: list[str]) -> None:
        self.acked.extend(ids)


def test_each_step_uses_the_coefficient_the_last_measured_entropy_set(tmp_path: Path) -> None:
    learner = FakeLearner([2.0, 0.2, 0.2, 0.2, 3.0])
    config = LoopConfig(steps=5, groups_per_step=1, samples_per_group=2, entropy_target=1.0)
    records: list[StepRecord] = []
    train(FakeClient(), learner, config, "job", tmp_path, records.append)  # type: ignore[arg-type]
    sent = [s["entropy_coef"] for s in learner.steps]
    assert sent == pytest.approx([0.0, 0.0, 0.004, 0.008, 0.012])
    assert [r.entropy_coef for r in records] == sent  # logged as used


def test_the_loop_keeps_the_coefficient_under_its_cap(tmp_path: Path) -> None:
    learner = FakeLearner([0.0, 0.0, 0.0, 0.0])
    config = LoopConfig(
        steps=4, groups_per_step=1, samples_per_group=2, entropy_target=5.0, entropy_max=0.06
    )
    train(FakeClient(), learner, config, "job", tmp_path, lambda _: None)  # type: ignore[arg-type]
    assert [s["entropy_coef"] for s in learner.steps] == pytest.approx([0.0, 0.025, 0.05, 0.06])


def test_the_loop_raises_the_coefficient_to_its_floor_below_the_target(tmp_path: Path) -> None:
    learner = FakeLearner([3.0, 0.5, 0.5])
    config = LoopConfig(
        steps=3, groups_per_step=1, samples_per_group=2, entropy_target=1.0, entropy_min=0.02
    )
    train(FakeClient(), learner, config, "job", tmp_path, lambda _: None)  # type: ignore[arg-type]
    sent = [s["entropy_coef"] for s in learner.steps]
    assert sent == pytest.approx([0.0, 0.0, 0.02])  # above the target: 0; then the floor


def test_without_a_target_the_coefficient_stays(tmp_path: Path) -> None:
    learner = FakeLearner([0.1, 0.1, 0.1])
    config = LoopConfig(steps=3, groups_per_step=1, samples_per_group=2, entropy_coef=0.02)
    train(FakeClient(), learner, config, "job", tmp_path, lambda _: None)  # type: ignore[arg-type]
    assert [s["entropy_coef"] for s in learner.steps] == [0.02, 0.02, 0.02]


def test_the_job_samples_the_whole_distribution_whatever_the_agent_asks() -> None:
    """An agent sending `top_p` or `top_k` would have the engine sample from, and report the
    logprobs of, a renormalized distribution the learner does not score."""
    job = sampling(LoopConfig(steps=1, groups_per_step=1, samples_per_group=2, temperature=0.9))
    validate_sampling(job)  # the door accepts it
    policy = sampling_policy(job)
    asked = {"messages": [], "temperature": 0.2, "top_p": 0.5, "top_k": 5, "max_tokens": 99}
    enforced = enforce(policy, asked)
    assert enforced is not None
    body, _ = enforced
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.9, 1.0, -1)
    assert body["max_tokens"] == 16  # clamped to the job's
    body, _ = enforce(policy, {"messages": []}) or ({}, {})
    assert (body["top_p"], body["top_k"]) == (1.0, -1)  # added when the agent sent none
    shaped = {"messages": [], "min_p": 0.2, "logit_bias": {"7": 5}, "repetition_penalty": 1.2}
    body, changes = enforce(policy, shaped) or ({}, {})
    assert not {"min_p", "logit_bias", "repetition_penalty"} & set(body)
    assert changes["min_p"] == [0.2, None]
