"""`exact_match` and `regex`: reward the agent's final answer text.

Small models decorate answers ("ANSWER: 42.", " 42 ", "4.0"), so `exact_match` normalises both
sides and compares numbers as numbers. Numbers compare exactly as decimals (no float tolerance):
an RL reward that accepts near misses teaches near misses.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator

_ANSWER_LINE = re.compile(r"ANSWER\s*:\s*([^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?")
_GROUPED_NUMBER = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def extract_answer(text: str) -> str:
    """The value of the last non-empty `ANSWER: x` line, else the whole text."""
    values = [m.group(1).strip() for m in _ANSWER_LINE.finditer(text)]
    values = [v for v in values if v]
    return values[-1] if values else text


def last_number(text: str) -> str:
    """The `ANSWER:` value if there is one, else the last number in the text (GSM8K-style
    extraction for models that answer in prose), else the whole text."""
    answer = extract_answer(text)
    if answer is not text:
        return answer
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else text


EXTRACTORS = {"answer_line": extract_answer, "last_number": last_number}


def normalize(text: str) -> str:
    """Strip, casefold, collapse whitespace, drop trailing periods."""
    return " ".join(text.strip().casefold().split()).rstrip(".").rstrip()


def as_number(text: str) -> Decimal | None:
    """A normalised text as an exact number, if it is one ("1,000" counts; "1,2" does not)."""
    if _GROUPED_NUMBER.fullmatch(text):
        text = text.replace(",", "")
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def answers_match(got: str, expected: str) -> bool:
    """Equal after normalisation, or both numbers of equal value ("4" == "4.0")."""
    left, right = normalize(got), normalize(expected)
    if left == right:
        return True
    left_number, right_number = as_number(left), as_number(right)
    return left_number is not None and left_number == right_number


class ExactMatchEvaluator(Evaluator):
    """1.0 when the answer equals `task[key]` (or any element, when that is a list).

    `extract` says how the answer is read from the final text: `answer_line` (the last
    `ANSWER: x`, else the whole text) or `last_number` (else the last number in the text).
    """

    name = "exact_match"

    def __init__(self, key: str = "answer", extract: str = "answer_line") -> None:
        if not isinstance(key, str) or not key:
            raise ValueError("exact_match: 'key' must be a non-empty string")
        if extract not in EXTRACTORS:
            raise ValueError(f"exact_match: 'extract' must be one of {', '.join(EXTRACTORS)}")
        self.key = key
        self.extract = EXTRACTORS[extract]

    def required_task_fields(self) -> frozenset[str]:
        return frozenset({self.key})

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        if self.key not in ctx.task:
            return EvalResult(None, {"error": f"task has no {self.key!r} field"})
        expected = _expected_values(ctx.task[self.key])
        if ctx.final_text is None:
            return EvalResult(0.0, {"answer": None, "expected": expected})
        answer = self.extract(ctx.final_text)
        hit = any(answers_match(answer, value) for value in expected)
        return EvalResult(1.0 if hit else 0.0, {"answer": answer, "expected": expected})


def _expected_values(raw: Any) -> list[str]:
    values = raw if isinstance(raw, list | tuple) else [raw]
    return [str(value) for value in values]


class RegexEvaluator(Evaluator):
    """1.0 when `pattern` is found in the final text (re.search), else 0.0."""

    name = "regex"

    def __init__(self, pattern: str, ignore_case: bool = False) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("regex: 'pattern' must be a non-empty string")
        try:
            self.pattern = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ValueError(f"regex: invalid pattern {pattern!r}: {exc}") from exc

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        text = ctx.final_text or ""
        match = self.pattern.search(text)
        return EvalResult(1.0 if match else 0.0, {"match": match.group(0) if match else None})
