"""Evaluators: built-ins, the command evaluator in a real runtime, and spec resolution."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_mq.evaluators import (
    CallableEvaluator,
    CommandEvaluator,
    CompletedEvaluator,
    EvalContext,
    EvalResult,
    ExactMatchEvaluator,
    RegexEvaluator,
    get_evaluator,
    validate_evaluator_spec,
)
from polar_mq.runtimes import LocalRuntime, Runtime
from tests.conftest import runtime_id


def make_ctx(
    final_text: str | None = "42",
    task: dict[str, Any] | None = None,
    runtime: Runtime | None = None,
    exit_code: int | None = 0,
    reason: str = "completed",
) -> EvalContext:
    return EvalContext(
        rollout_id="r-1",
        task={"instruction": "6*7?", "answer": "42"} if task is None else task,
        runtime=runtime,
        workdir=runtime.workdir if runtime else None,
        agent_exit_code=exit_code,
        termination_reason=reason,
        final_text=final_text,
    )


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(runtime_id("eval-rt"), tmp_path)
    rt.start()
    yield rt
    rt.stop()


@pytest.mark.parametrize(
    ("exit_code", "reason", "reward"),
    [(0, "completed", 1.0), (1, "completed", 0.0), (0, "max_turns", 0.0), (None, "timeout", 0.0)],
)
def test_completed(exit_code: int | None, reason: str, reward: float) -> None:
    result = CompletedEvaluator().evaluate(make_ctx(exit_code=exit_code, reason=reason))
    assert result.reward == reward
    assert result.detail == {"exit_code": exit_code, "termination_reason": reason}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("42", "42"),
        ("  42.  ", "42"),
        ("4", "4.0"),
        ("-0.50", "-.5"),
        ("1e3", "1000"),
        ("1,000", "1000"),
        ("Let me think.\nANSWER: 42\n", "42"),
        ("ANSWER: 1\nanswer:  Paris.", "paris"),
        ("New   York", "new york"),
        ("ÉCOLE", "école"),
    ],
)
def test_exact_match_accepts(answer: str, expected: str) -> None:
    result = ExactMatchEvaluator().evaluate(make_ctx(answer, task={"answer": expected}))
    assert result.reward == 1.0, result.detail


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("41", "42"),
        ("4.01", "4"),
        ("12345678901234567891", "12345678901234567890"),  # exact, not float-close
        ("42 apples", "42"),
        ("1,2", "12"),
        ("", "42"),
        ("ANSWER: 41\nThe answer is 42", "42"),
    ],
)
def test_exact_match_rejects(answer: str, expected: str) -> None:
    result = ExactMatchEvaluator().evaluate(make_ctx(answer, task={"answer": expected}))
    assert result.reward == 0.0, result.detail


def test_exact_match_options_and_edge_cases() -> None:
    keyed = ExactMatchEvaluator(key="solution")
    assert keyed.evaluate(make_ctx("7", task={"solution": 7})).reward == 1.0
    assert keyed.evaluate(make_ctx("7", task={"solution": ["6", 7.0]})).reward == 1.0
    missing = keyed.evaluate(make_ctx("7", task={"answer": "7"}))
    assert missing.reward is None and "solution" in missing.detail["error"]
    no_answer = ExactMatchEvaluator().evaluate(make_ctx(None))
    assert no_answer.reward == 0.0 and no_answer.detail["answer"] is None


def test_regex() -> None:
    evaluator = RegexEvaluator(r"\bparis\b", ignore_case=True)
    assert evaluator.evaluate(make_ctx("It is Paris.")).reward == 1.0
    assert evaluator.evaluate(make_ctx("Lyon")).reward == 0.0
    assert evaluator.evaluate(make_ctx(None)).reward == 0.0
    with pytest.raises(ValueError, match="invalid pattern"):
        RegexEvaluator("(")


def test_command_reward_from_exit_code(runtime: LocalRuntime) -> None:
    runtime.upload(b"42\n", "answer.txt")
    passing = CommandEvaluator('test "$(cat answer.txt)" = 42 && echo PASS')
    result = passing.evaluate(make_ctx(runtime=runtime))
    assert result.reward == 1.0
    assert result.detail["exit_code"] == 0 and result.detail["stdout_tail"] == "PASS\n"
    failing = CommandEvaluator(["/bin/sh", "-c", "echo FAIL >&2; exit 1"])
    result = failing.evaluate(make_ctx(runtime=runtime))
    assert result.reward == 0.0
    assert result.detail["exit_code"] == 1 and result.detail["stderr_tail"] == "FAIL\n"
    assert CommandEvaluator.needs_runtime


def test_command_reward_file_timeout_and_no_runtime(runtime: LocalRuntime) -> None:
    partial = CommandEvaluator(
        'echo 0.25 > reward.txt; test "$POLAR_ROLLOUT_ID" = r-1', reward_file="reward.txt"
    )
    assert partial.evaluate(make_ctx(runtime=runtime)).reward == 0.25

    unwritten = CommandEvaluator("true", reward_file="nothing.txt")
    result = unwritten.evaluate(make_ctx(runtime=runtime))
    assert result.reward == 0.0 and "FileNotFoundError" in result.detail["reward_file_error"]

    slow = CommandEvaluator("echo 1 > reward.txt; sleep 30", timeout=0.3, reward_file="reward.txt")
    result = slow.evaluate(make_ctx(runtime=runtime))
    assert result.reward == 0.0 and result.detail["timed_out"] is True

    result = CommandEvaluator("true").evaluate(make_ctx(runtime=None))
    assert result.reward is None and "runtime" in result.detail["error"]


USER_MODULE = textwrap.dedent(
    """
    from polar_mq.evaluators import EvalResult, Evaluator

    def length_reward(ctx, scale=1.0):
        return scale * len(ctx.final_text or "")

    def is_even(ctx):
        return int(ctx.final_text) % 2 == 0

    class Strict(Evaluator):
        name = "strict"

        def __init__(self, expected="42"):
            self.expected = expected

        def evaluate(self, ctx):
            return EvalResult(float(ctx.final_text == self.expected), {"strict": True})

    class Duck:
        def evaluate(self, ctx):
            return None

    NOT_CALLABLE = 3

    class Scorers:
        @staticmethod
        def half(ctx):
            return 0.5
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "polar_user_evals.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "polar_user_evals"


def test_get_evaluator_by_name_and_spec() -> None:
    assert isinstance(get_evaluator("completed"), CompletedEvaluator)
    keyed = get_evaluator({"name": "exact_match", "key": "gold"})
    assert isinstance(keyed, ExactMatchEvaluator) and keyed.key == "gold"
    command = get_evaluator({"name": "command", "command": "pytest -q", "timeout": 5})
    assert isinstance(command, CommandEvaluator) and command.timeout == 5.0


def test_get_evaluator_import_paths(user_module: str) -> None:
    ctx = make_ctx("42")
    scaled = get_evaluator({"name": f"{user_module}:length_reward", "scale": 0.5})
    assert isinstance(scaled, CallableEvaluator) and scaled.evaluate(ctx).reward == 1.0
    assert get_evaluator(f"{user_module}:is_even").evaluate(ctx) == EvalResult(1.0, {})
    strict = get_evaluator({"name": f"{user_module}:Strict", "expected": "42"})
    assert strict.evaluate(ctx) == EvalResult(1.0, {"strict": True})
    assert get_evaluator(f"{user_module}:Duck").evaluate(ctx).reward is None
    assert get_evaluator(f"{user_module}:Scorers.half").evaluate(ctx).reward == 0.5
    python = get_evaluator({"name": "python", "callable": f"{user_module}:length_reward"})
    assert python.evaluate(ctx).reward == 2.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown evaluator 'nope'; known evaluators: command, completed, exact_match"),
        ({"key": "answer"}, "needs a 'name'"),
        (42, "must be a name or a mapping"),
        ({"name": "exact_match", "keys": "x"}, "bad parameters"),
        ({"name": "exact_match", "key": 3}, "non-empty string"),
        ({"name": "command"}, "bad parameters"),
        ({"name": "command", "command": "x", "timeout": -1}, "positive"),
        ({"name": "regex", "pattern": "[a"}, "invalid pattern"),
        ({"name": "python"}, "needs 'callable'"),
        ("no_such_module_xyz:fn", "is not allowed"),  # outside the import allow-list
        ("tests.no_such_module_xyz:fn", "cannot import"),
        ("polar_mq.evaluators:missing", "cannot import"),
        ("bad path:x", "must look like"),
    ],
)
def test_validate_rejects_bad_specs(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_evaluator_spec(spec)


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("NOT_CALLABLE", "neither a class nor a callable"),
        ("is_even", "bad parameters"),
    ],
)
def test_validate_rejects_bad_user_targets(user_module: str, attr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_evaluator_spec({"name": f"{user_module}:{attr}", "unexpected": 1})


def test_validate_accepts_good_specs() -> None:
    for spec in ("completed", {"name": "exact_match"}, {"name": "regex", "pattern": "4[0-9]"}):
        validate_evaluator_spec(spec)


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("So, 22 - 4 = 18.", 1.0),
        ("22 - 4 is 18, or 1,018 minus 1,000", 0.0),
        ("I think 17. ANSWER: 18", 1.0),
        ("no number at all", 0.0),
    ],
)
def test_exact_match_last_number_extraction(text: str, reward: float) -> None:
    evaluator = get_evaluator({"name": "exact_match", "extract": "last_number"})
    ctx = EvalContext(
        rollout_id="r", task={"answer": "18"}, runtime=None, workdir=None,
        agent_exit_code=0, termination_reason="completed", final_text=text,
    )  # fmt: skip
    assert evaluator.evaluate(ctx).reward == reward


def test_exact_match_rejects_unknown_extraction() -> None:
    with pytest.raises(ValueError, match="extract"):
        validate_evaluator_spec({"name": "exact_match", "extract": "vibes"})
