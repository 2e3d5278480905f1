"""Why a rollout got its reward: the task, the expected and the graded answer, the evaluator's
errors, and for repository tasks the graded diff and each test's outcome.

The evaluation's `detail` is free-form per evaluator; this module reads the conventions the
built-in ones follow (`error`/`message` for an unscored verdict, `answer`/`expected` for the
matchers, `diff*` and `tests_*`/`counts` for `tests`, `parts`/`gate`/`then` for composites) into
one shape the template draws, and leaves everything else to the raw JSON shown beside it. Long
texts are cut here (the page stays small whatever an agent wrote); the template escapes them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.jobs.read_models import EvaluationRecord, RolloutDetail
from polar_mq.models import JobTask, Rollout, TerminationReason

TEXT_CHARS = 8_000
"""An instruction or an answer longer than this is cut for the page."""
DIFF_CHARS = 64_000
"""The graded diff shown on the page (the evaluation already caps what it stores)."""
TEST_LISTS = ("passed", "failed", "skipped", "missing")
PART_KEYS = ("parts", "gate", "then")
RAW_CHARS = 16_000


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more chars)"


def _text(value: Any, limit: int = TEXT_CHARS) -> str | None:
    if value is None:
        return None
    return cut(value if isinstance(value, str) else repr(value), limit)


@dataclass(frozen=True, slots=True)
class TestOutcomes:
    counts: dict[str, int]
    names: dict[str, list[str]]
    """Per outcome (passed, failed, skipped, missing), the test names the evaluation kept."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One evaluator's verdict (the job's, or one part of a composite)."""

    name: str
    reward: float | None
    answer: str | None = None
    expected: list[str] | None = None
    error: str | None = None
    diff: str | None = None
    diff_note: str | None = None
    tests: TestOutcomes | None = None
    parts: list[Verdict] = field(default_factory=list)


def verdict(name: str, reward: float | None, detail: dict[str, Any]) -> Verdict:
    """Read one evaluation detail (recursively through a composite's parts)."""
    error = " — ".join(
        str(detail[k])
        for k in ("error", "message", "junit_error", "diff_error", "reward_file_error")
        if detail.get(k)
    )
    expected = detail.get("expected")
    if expected is not None and not isinstance(expected, list):
        expected = [expected]
    diff = detail.get("diff")
    notes = []
    if detail.get("diff_truncated"):
        notes.append("cut by the evaluator's max_diff_chars")
    if detail.get("tampering"):
        notes.append(f"dropped (protected paths): {', '.join(map(str, detail['tampering']))}")
    tests = None
    if isinstance(detail.get("counts"), dict):
        names = {k: [str(n) for n in detail.get(f"tests_{k}") or []] for k in TEST_LISTS}
        counts = {k: int(detail["counts"].get(k, 0)) for k in TEST_LISTS}
        tests = TestOutcomes(counts, names)
    parts = [
        verdict(str(p.get("name", "?")), p.get("reward"), p.get("detail") or {})
        for p in _part_records(detail)
    ]
    return Verdict(
        name=name,
        reward=reward,
        answer=_text(detail.get("answer", detail.get("match"))),
        expected=None if expected is None else [_text(e) or "" for e in expected],
        error=error or None,
        diff=None if not isinstance(diff, str) else cut(diff, DIFF_CHARS),
        diff_note="; ".join(notes) or None,
        tests=tests,
        parts=parts,
    )


def _part_records(detail: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key in PART_KEYS:
        value = detail.get(key)
        items = value if isinstance(value, list) else [value]
        out.extend(item for item in items if isinstance(item, dict) and "detail" in item)
    return out


@dataclass(frozen=True, slots=True)
class RewardExplanation:
    instruction: str | None
    task_answer: str | None
    """The task's own `answer` field, when it has one (what exact_match compares with)."""
    verdict: Verdict | None
    unscored_reason: str | None
    """Why there is no evaluation to show (an infrastructure failure, not evaluated yet)."""
    raw_detail: str | None
    """The evaluation's detail as JSON (its diff left out: shown above), cut to RAW_CHARS."""


def task_instance(session: Session, rollout_id: uuid.UUID) -> dict[str, Any]:
    instance = session.scalar(
        select(JobTask.instance)
        .join(Rollout, Rollout.task_id == JobTask.id)
        .where(Rollout.id == rollout_id)
    )
    return instance if isinstance(instance, dict) else {}


def explain(detail: RolloutDetail, task: dict[str, Any]) -> RewardExplanation:
    evaluation: EvaluationRecord | None = detail.evaluation
    unscored = None
    if evaluation is None:
        if detail.termination_reason in TerminationReason.INFRASTRUCTURE:
            unscored = (
                f"not scored: the rollout ended with {detail.termination_reason}, an "
                "infrastructure failure (no reward, left out of its group's statistics)"
            )
        elif detail.status in ("completed", "failed", "cancelled"):
            unscored = "no evaluation was recorded for this attempt"
        else:
            unscored = "not evaluated yet"
    answer = task.get("answer")
    return RewardExplanation(
        instruction=_text(task.get("instruction")),
        task_answer=None if answer is None else _text(answer),
        verdict=None
        if evaluation is None
        else verdict(evaluation.evaluator, evaluation.reward, evaluation.detail),
        unscored_reason=unscored,
        raw_detail=None if evaluation is None else _raw(evaluation.detail),
    )


def _raw(detail: dict[str, Any]) -> str:
    shown = {k: v for k, v in detail.items() if k != "diff"}
    text = orjson.dumps(shown, option=orjson.OPT_INDENT_2, default=str).decode()
    return cut(text, RAW_CHARS)
