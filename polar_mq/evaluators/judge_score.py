"""Reading a score out of a judge model's reply, and putting it on a 0..1 scale.

Judges answer in many shapes: `{"score": 7}`, `[[8]]` (MT-Bench style), `Score: 7/10`,
`**Rating:** 4 out of 5`, or just `7`. The forms are tried from the most to the least explicit and
the last occurrence of a form wins (a judge's verdict comes after its reasoning). Anything else is
unparseable: a guess from a stray number in the prose would reward noise, so the caller reports
None with the reply instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_OUT_OF = rf"(?:\s*(?:/|out\s+of)\s*({_NUM}))?"
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_DOUBLE_BRACKETS = re.compile(rf"\[\[\s*({_NUM}){_OUT_OF}\s*\]\]", re.IGNORECASE)
_EMPHASIS = r"[ \t]*(?:\*\*|__)?[ \t]*"
_LABELLED = re.compile(
    rf"\b(?:score|rating|grade){_EMPHASIS}[:=]{_EMPHASIS}({_NUM}){_OUT_OF}", re.IGNORECASE
)
_BARE = re.compile(rf"({_NUM}){_OUT_OF}", re.IGNORECASE)
_THINKING = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_JSON_KEYS = ("score", "rating", "grade")


@dataclass(frozen=True, slots=True)
class Score:
    """A parsed score, the scale the judge stated with it (`7/10` -> 10) and the form it had."""

    value: float
    out_of: float | None
    form: str


def _finite(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _from_match(match: re.Match[str] | None, form: str) -> Score | None:
    if match is None:
        return None
    value = _finite(match.group(1))
    if value is None:
        return None
    out_of = _finite(match.group(2)) if (match.re.groups or 0) >= 2 else None
    return Score(value, out_of, form)


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - the last one is wanted
        pass
    return found


def _json_score(text: str) -> Score | None:
    for candidate in reversed(_JSON_OBJECT.findall(text)):
        try:
            data = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        lowered = {str(key).casefold(): value for key, value in data.items()}
        for key in _JSON_KEYS:
            raw = lowered.get(key)
            if isinstance(raw, bool):
                continue
            value = _finite(str(raw)) if isinstance(raw, int | float | str) else None
            if value is not None:
                return Score(value, None, "json")
    return None


def _bare(text: str) -> Score | None:
    stripped = text.strip().strip("*_`'\"").strip().rstrip(".").strip()
    return _from_match(_BARE.fullmatch(stripped), "bare")


_FORMS: tuple[Callable[[str], Score | None], ...] = (
    _json_score,
    lambda text: _from_match(_last(_DOUBLE_BRACKETS, text), "brackets"),
    lambda text: _from_match(_last(_LABELLED, text), "labelled"),
    _bare,
)


def parse_score(text: str, pattern: re.Pattern[str] | None = None) -> Score | None:
    """The judge's score, or None. With `pattern` (one capture group), only that form counts."""
    text = _THINKING.sub("", text)  # a reasoning model's scratchpad is not its verdict
    if pattern is not None:
        return _from_match(_last(pattern, text), "pattern")
    for form in _FORMS:
        score = form(text)
        if score is not None:
            return score
    return None


def normalise(score: Score, low: float, high: float) -> tuple[float | None, str | None]:
    """(reward in [0, 1], None), or (None, why the score does not fit the configured scale)."""
    if score.out_of is not None and score.out_of != high:
        return None, f"judge scored out of {score.out_of:g}, the scale is {low:g}..{high:g}"
    if not low <= score.value <= high:
        return None, f"score {score.value:g} is outside the scale {low:g}..{high:g}"
    return (score.value - low) / (high - low), None
