"""Dynamic sampling (`resampling`): a step leases more groups in place of flat ones, trains on the
groups with signal only and acknowledges every group it leased (unit tests: the loop runs against
stand-ins of the client and the learner)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar_mq.training.loop import LoopConfig, submit_training_job, train
from polar_mq.training.metrics import StepRecord
from polar_mq.training.resampling import flat_fill, step_groups

TRAJ = {"prompt_ids": [1], "response_ids": [5, 6], "loss_mask": [1, 1], "logprobs": [-1.0, -1.0]}


def group(name: str, rewards: tuple[float, ...]) -> dict[str, Any]:
    samples = [{"usable": True, "reward": r, "trajectories": [TRAJ]} for r in rewards]
    return {"delivery": {"delivery_id": name}, "samples": samples, "name": name}


FLAT = (0.5, 0.5)
SIGNAL = (0.0, 1.0)


def stream(*kinds: tuple[float, ...], per_batch: int = 2) -> Iterator[list[dict[str, Any]]]:
    groups = [group(f"g{i}", rewards) for i, rewards in enumerate(kinds)]
    for start in range(0, len(groups), per_batch):
        yield groups[start : start + per_batch]


def names(groups: list[dict[str, Any]] | None) -> list[str]:
    assert groups is not None
    return [g["name"] for g in groups]


def test_a_batch_with_signal_is_taken_alone() -> None:
    batches = stream(SIGNAL, SIGNAL, FLAT, SIGNAL)
    assert names(step_groups(batches, wanted=2, extra=4)) == ["g0", "g1"]
    assert names(step_groups(batches, wanted=2, extra=4)) == ["g2", "g3"]  # the rest: next step


def test_flat_groups_are_made_up_for_up_to_the_extra_groups() -> None:
    batches = stream(FLAT, SIGNAL, FLAT, FLAT, SIGNAL, FLAT, SIGNAL, SIGNAL)
    # g1 has signal, g2-g3 none, g4 the second: stop there (4 leased on top of the first 2)
    assert names(step_groups(batches, wanted=2, extra=4)) == ["g0", "g1", "g2", "g3", "g4", "g5"]
    assert names(step_groups(stream(FLAT, FLAT, FLAT, FLAT, SIGNAL), 2, extra=2)) == [
        "g0", "g1", "g2", "g3",
    ]  # fmt: skip
    assert names(step_groups(stream(FLAT, FLAT, SIGNAL), 2, extra=0)) == ["g0", "g1"]  # off


def test_the_end_of_the_stream_ends_the_step_and_then_the_steps() -> None:
    batches = stream(FLAT, FLAT, FLAT)
    assert names(step_groups(batches, wanted=2, extra=8)) == ["g0", "g1", "g2"]
    assert step_groups(batches, wanted=2, extra=8) is None


class Learner:
    def __init__(self) -> None:
        self.sent: list[list[dict[str, Any]]] = []

    def call(self, op: str, **request: Any) -> dict[str, Any]:
        if op != "step":
            return {}
        self.sent.append(request["samples"])
        return {"tokens": 2, "loss": 0.1, "grad_norm": 0.5, "clipped_tokens": 0,
                "mismatch_mean": 0.0, "mismatch_max": 0.0, "mismatch_tokens": 2,
                "entropy_mean": 1.0}  # fmt: skip


class Client:
    def __init__(self, *kinds: tuple[float, ...]) -> None:
        self.kinds = kinds
        self.version = 1
        self.acked: list[list[str]] = []
        self.submitted: dict[str, Any] = {}

    def policy(self) -> dict[str, Any]:
        return {"version": self.version}

    def stream_groups(self, job_id: str, **_: Any) -> Iterator[list[dict[str, Any]]]:
        return stream(*self.kinds)

    def set_policy(self, version: int, adapter_path: str) -> dict[str, Any]:
        self.version = version
        return {"adapter_loaded": True}

    def ack_groups(self, job_id: str, consumer: str, ids: list[str]) -> None:
        self.acked.append(ids)

    def submit(self, tasks: list[dict[str, Any]], **spec: Any) -> Any:
        self.submitted = {"tasks": tasks, **spec}
        return type("Job", (), {"job_id": "job"})()


def test_the_loop_trains_on_the_groups_with_signal_and_acks_every_group(tmp_path: Path) -> None:
    client = Client(FLAT, FLAT, SIGNAL, FLAT, SIGNAL, SIGNAL, FLAT, FLAT, FLAT, FLAT)
    learner = Learner()
    config = LoopConfig(steps=3, groups_per_step=2, samples_per_group=2, resample_flat=2)
    records: list[StepRecord] = []
    train(client, learner, config, "job", tmp_path, records.append)  # type: ignore[arg-type]
    assert client.acked == [["g0", "g1", "g2", "g3"], ["g4", "g5"], ["g6", "g7", "g8", "g9"]]
    assert [r.groups for r in records] == [4, 2, 4]
    assert [r.zero_variance_fraction for r in records] == [0.75, 0.0, 1.0]
    # the learner gets two groups' samples a step: those with signal, flat ones to make up two
    # (scored for the entropy bonus, never trained on)
    assert [[s["train"] for s in samples] for samples in learner.sent] == [
        [False, False, True, True], [True] * 4, [False] * 4,
    ]  # fmt: skip


def test_flat_groups_make_up_the_learners_share_only_when_resampling() -> None:
    groups = [group("a", FLAT), group("b", SIGNAL), group("c", FLAT), group("d", FLAT)]
    assert flat_fill(groups, wanted=2, extra=2) == 1
    assert flat_fill(groups, wanted=1, extra=2) == 0
    assert flat_fill(groups, wanted=2, extra=0) is None  # off: every flat group, as before


def test_without_resampling_flat_groups_are_scored_not_trained(tmp_path: Path) -> None:
    client = Client(FLAT, SIGNAL, SIGNAL, SIGNAL)
    learner = Learner()
    config = LoopConfig(steps=2, groups_per_step=2, samples_per_group=2)
    train(client, learner, config, "job", tmp_path, lambda _: None)  # type: ignore[arg-type]
    assert client.acked == [["g0", "g1"], ["g2", "g3"]]
    assert [s["train"] for s in learner.sent[0]] == [False, False, True, True]


def test_the_job_holds_and_may_generate_the_extra_groups() -> None:
    client = Client()
    config = LoopConfig(steps=3, groups_per_step=2, samples_per_group=4, resample_flat=2)
    submit_training_job(client, config, [{"q": i} for i in range(5)])  # type: ignore[arg-type]
    assert len(client.submitted["tasks"]) == 24  # those that go stale use the job up too
    assert client.submitted["staleness"]["batch_size"] == 4
