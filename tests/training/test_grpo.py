"""GRPO's bookkeeping on polar_mq groups (pure Python, the project venv): advantages, the groups
without signal, unusable samples, staleness, and the task set's reward."""

from __future__ import annotations

from typing import Any

import pytest

from polar_mq.training.grpo import STD_EPS, batch_samples, group_advantages
from polar_mq.training.tasks import ANSWERS, all_tasks, score, split


def test_advantages_are_group_normalised() -> None:
    advantages = group_advantages([1.0, 0.0, 0.5, 0.5])
    assert advantages is not None
    std = (0.125) ** 0.5  # population std of the four rewards around 0.5
    assert advantages == pytest.approx([0.5 / (std + STD_EPS), -0.5 / (std + STD_EPS), 0, 0])
    assert sum(advantages) == pytest.approx(0.0)


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [0.0, 0.0], [0.7]])
def test_no_variance_no_advantages(rewards: list[float]) -> None:
    assert group_advantages(rewards) is None


def traj(n: int, logprobs: bool = True) -> dict[str, Any]:
    return {
        "prompt_ids": [1, 2, 3],
        "response_ids": list(range(10, 10 + n)),
        "loss_mask": [1] * n,
        "logprobs": [-0.5] * n if logprobs else None,
    }


def sample(reward: float | None, usable: bool = True, **kw: Any) -> dict[str, Any]:
    return {"usable": usable, "reward": reward, "trajectories": [traj(2, **kw)]}


def test_a_batch_skips_flat_groups_and_unusable_samples() -> None:
    batch = [
        {"policy_versions": {"min": 3}, "samples": [sample(1.0), sample(0.0), sample(None, False)]},
        {"policy_versions": {"min": 4}, "samples": [sample(0.5), sample(0.5)]},  # no signal
        {"policy_versions": {"min": 4}, "samples": [sample(1.0), sample(0.0, logprobs=False)]},
    ]
    out = batch_samples(batch, version=4)
    assert out.groups == 3 and out.zero_variance_groups == 1
    assert out.rewards == [1.0, 0.0, 0.5, 0.5, 1.0, 0.0]  # the unusable sample has none
    assert out.staleness == [1, 0, 0]
    assert out.no_logprobs == 1
    trained = [s for s in out.samples if s.train]
    assert [s.advantage for s in trained] == pytest.approx([1.0, -1.0, 1.0], abs=1e-5)
    # the flat group's samples are measured (logprob mismatch), not trained on
    assert [(s.advantage, s.train) for s in out.samples[2:4]] == [(0.0, False), (0.0, False)]
    assert all(s.loss_mask == [1, 1] and s.logprobs == [-0.5, -0.5] for s in out.samples)


def test_the_reward_pays_the_answer_and_brevity() -> None:
    assert score("Lima.", "Lima") == 1.0
    assert score("The capital of Peru is Lima.", "Lima") == pytest.approx(0.5 + 0.5 / 6)
    assert score("The capital of Peru is the city of Lima, Peru.", "Lima") == 0.5
    assert score("It is a city in the mountains of Peru", "Lima") == 0.0
    assert score(None, "Lima") == 0.0 and score("...", "Lima") == 0.0
    assert score("limabean", "Lima") == 0.0  # a whole word, not a substring


def test_brevity_alone_earns_nothing() -> None:
    """A constant short reply cannot game the reward: it scores only where it is the answer."""
    assert score("Cusco", "Lima") == 0.0
    tasks = all_tasks()
    for constant in ("Yes", "Paris", "1"):
        mean = sum(score(constant, str(t["answer"])) for t in tasks) / len(tasks)
        assert mean < 0.05, constant


def test_a_shotgun_of_candidates_earns_nothing() -> None:
    """Listing candidates cannot buy the hit rate of knowing: a reply naming the answer and
    another task's answer scores 0, on every task; question words are exempt."""
    tasks = all_tasks()
    for task in tasks:
        answer, question = str(task["answer"]), str(task["instruction"])
        other = next(str(t["answer"]) for t in tasks if str(t["answer"]) != answer)
        assert score(f"{answer} or {other}", answer, question) == 0.0, question
        assert score(f"{other}, {answer}", answer, question) == 0.0, question
        assert score(answer, answer, question) == 1.0, question  # committing to one still pays
    every_answer = " ".join(sorted(ANSWERS))
    assert all(score(every_answer, str(t["answer"]), str(t["instruction"])) == 0 for t in tasks)
    # the opposites share words: the asked word is not a second guess
    assert score("The opposite of old is new.", "new", "What is the opposite of 'old'?") > 0.5
    # words that answer no task cannot raise the hit rate: they cost brevity only
    peru = "What is the capital of Peru?"
    assert score("Lima, Cusco", "Lima", peru) == score("Lima, Peru", "Lima", peru)
    assert score("Lima, Cusco", "Lima", peru) == pytest.approx(0.5 + 0.5 * 5 / 6)


def test_the_eval_split_is_held_out_and_seeded() -> None:
    train, held_out = split(0)
    assert len(train) + len(held_out) == len(all_tasks())
    assert not {t["instruction"] for t in train} & {t["instruction"] for t in held_out}
    assert split(0) == (train, held_out) and split(1) != (train, held_out)
