"""The task set the tiny model learns on this CPU, and its reward.

Short factual questions whose answer is one word (capitals, opposites, sums), asked with
"Answer with one word." SmolLM2-135M-Instruct often knows the fact but answers in a sentence
("The capital of Peru is Lima."), and sampled it often rambles. The reward is 0 unless the
answer word appears and no other task's answer does; then half, plus the other half for brevity
in proportion (all of it for the word alone, nothing from `WORDS_TO_ZERO` words on). The model
is right often enough that most groups hold replies of different lengths, so GRPO has a signal,
and the gain to learn is a format the base model misses (stop after the answer), not a fact it
does not know.

`reward` is the job's evaluator (`{"name": "python", "callable":
"polar_mq.training.tasks:reward"}`): it runs in the workers, on the agent's last message.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the learner's venv imports this module too, and has no polar_mq deps
    from polar_mq.evaluators.base import EvalContext, EvalResult

SUFFIX = " Answer with one word."
CAPITALS = {
    "France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
    "Japan": "Tokyo", "Egypt": "Cairo", "Russia": "Moscow", "Greece": "Athens",
    "Portugal": "Lisbon", "Austria": "Vienna", "Norway": "Oslo", "Sweden": "Stockholm",
    "Ireland": "Dublin", "Poland": "Warsaw", "Kenya": "Nairobi", "Peru": "Lima",
    "China": "Beijing", "Thailand": "Bangkok", "Cuba": "Havana", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Hungary": "Budapest", "Turkey": "Ankara", "Chile": "Santiago",
    "Canada": "Ottawa", "England": "London", "Belgium": "Brussels", "Iran": "Tehran",
    "Iraq": "Baghdad", "South Korea": "Seoul", "Vietnam": "Hanoi", "Indonesia": "Jakarta",
    "the Philippines": "Manila", "the Czech Republic": "Prague", "Romania": "Bucharest",
    "Syria": "Damascus", "Lebanon": "Beirut", "Afghanistan": "Kabul", "Venezuela": "Caracas",
    "Iceland": "Reykjavik", "Saudi Arabia": "Riyadh", "Qatar": "Doha", "Scotland": "Edinburgh",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Libya": "Tripoli", "Jordan": "Amman",
    "Ghana": "Accra",
}  # fmt: skip
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad",
    "day": "night", "old": "new", "open": "closed", "light": "dark", "early": "late",
    "wet": "dry", "full": "empty", "hard": "soft", "high": "low", "rich": "poor",
    "strong": "weak", "good": "bad", "black": "white", "in": "out", "left": "right",
    "true": "false", "win": "lose", "love": "hate", "young": "old", "thick": "thin",
    "long": "short", "clean": "dirty", "heavy": "light", "near": "far", "push": "pull",
    "buy": "sell", "first": "last",
}  # fmt: skip
WORDS_TO_ZERO = 7
"""A reply of this many words or more gets no brevity credit."""
_WORD = re.compile(r"[A-Za-z0-9]+")


def all_tasks() -> list[dict[str, Any]]:
    """Every task: an instruction and its one-word answer, in a fixed order."""
    tasks = [
        {"instruction": f"What is the capital of {country}?{SUFFIX}", "answer": city}
        for country, city in CAPITALS.items()
    ]
    tasks += [
        {"instruction": f"What is the opposite of '{word}'?{SUFFIX}", "answer": other}
        for word, other in OPPOSITES.items()
    ]
    tasks += [
        {"instruction": f"What is {a} plus {b}?{SUFFIX}", "answer": str(a + b)}
        for a, b in (
            (2, 3),
            (4, 5),
            (6, 1),
            (7, 2),
            (3, 3),
            (8, 1),
            (5, 4),
            (2, 7),
            (1, 1),
            (3, 4),
            (6, 2),
            (5, 5),
            (4, 4),
            (3, 6),
            (1, 8),
            (2, 2),
        )
    ]
    return tasks


Tasks = list[dict[str, Any]]


def split(seed: int, eval_fraction: float = 0.25) -> tuple[Tasks, Tasks]:
    """(train, held-out eval): a shuffle of every task by `seed`, the eval part never trained on."""
    tasks = all_tasks()
    random.Random(seed).shuffle(tasks)
    n_eval = max(1, round(len(tasks) * eval_fraction))
    return tasks[n_eval:], tasks[:n_eval]


def _words(text: str | None) -> list[str]:
    return [w.lower() for w in _WORD.findall(text or "")]


ANSWERS = frozenset(w for task in all_tasks() for w in _words(str(task["answer"])))
"""Every task's answer word: a reply naming two of them hedges, and hedging is not knowing."""


def score(text: str | None, answer: str, question: str = "") -> float:
    """0 without the answer word; with it, 0.5 plus up to 0.5 the shorter the reply.

    Brevity earns nothing on its own: a constant one-word reply scores only where it happens to
    be the answer. Nor does a shotgun ("Lima, Santiago, Havana"): a reply that also names another
    task's answer scores 0, so listing candidates cannot buy the hit rate of knowing. Words of
    the `question` are exempt (the opposites share words: 'old' is asked and answered), and
    words that answer no task cannot raise the hit rate, so they cost only brevity."""
    words = _words(text)
    wanted = answer.lower()
    if wanted not in words:
        return 0.0
    if (ANSWERS - {wanted} - set(_words(question))) & set(words):
        return 0.0
    brevity = max(0.0, 1.0 - (len(words) - 1) / (WORDS_TO_ZERO - 1))
    return 0.5 + 0.5 * brevity


def reward(ctx: EvalContext) -> EvalResult:
    """The evaluator: the score of the agent's answer (its last message) against the task's."""
    from polar_mq.evaluators.base import EvalResult

    answer = str(ctx.task["answer"])
    value = score(ctx.final_text, answer, str(ctx.task.get("instruction", "")))
    return EvalResult(value, {"answer": answer, "reply": (ctx.final_text or "")[:200]})
