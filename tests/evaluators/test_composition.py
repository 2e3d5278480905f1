"""Composite evaluators: weighted sums, gates, their needs, their spec errors, error capture."""

from __future__ import annotations

from typing import Any

import pytest

from polar_mq.evaluators import (
    EvalContext,
    EvalResult,
    GateEvaluator,
    WeightedEvaluator,
    evaluate_safely,
    get_evaluator,
    validate_evaluator_spec,
)
from polar_mq.evaluators.registry import MAX_DEPTH

HERE = "tests.evaluators.test_composition"
CALLS: list[str] = []
"""Filled by `recorded` through the task (the import path loads this file as a second module)."""


def make_ctx(
    final_text: str | None = "ANSWER: 42", task: dict[str, Any] | None = None
) -> EvalContext:
    return EvalContext(
        rollout_id="r-1",
        task={"instruction": "6*7?", "answer": "42", "calls": CALLS} if task is None else task,
        runtime=None,
        workdir=None,
        agent_exit_code=0,
        termination_reason="completed",
        final_text=final_text,
    )


def recorded(ctx: EvalContext, value: float | None, tag: str = "x") -> float | None:
    """A `python` evaluator that notes it ran (to prove a gate skipped its `then`)."""
    ctx.task["calls"].append(tag)
    return value


def explode(ctx: EvalContext) -> float:
    raise RuntimeError("scorer bug: division by zero in rubric")


def spec_of(value: float | None, tag: str = "x") -> dict[str, Any]:
    return {"name": "python", "callable": f"{HERE}:recorded", "value": value, "tag": tag}


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    CALLS.clear()


def test_weighted_sum_of_parts_with_each_part_in_the_detail() -> None:
    evaluator = get_evaluator(
        {
            "name": "weighted",
            "evaluators": [
                {"spec": "exact_match", "weight": 0.75},  # "42" == "42" -> 1.0
                {"spec": {"name": "regex", "pattern": "banana"}, "weight": 0.25},  # -> 0.0
                {"spec": spec_of(0.5), "weight": -0.5},  # a penalty term
            ],
        }
    )
    assert isinstance(evaluator, WeightedEvaluator)
    result = evaluator.evaluate(make_ctx())
    assert result.reward == pytest.approx(0.75 * 1.0 + 0.25 * 0.0 - 0.5 * 0.5)
    parts = result.detail["parts"]
    assert [(p["name"], p["weight"], p["reward"]) for p in parts] == [
        ("exact_match", 0.75, 1.0),
        ("regex", 0.25, 0.0),
        ("python", -0.5, 0.5),
    ]
    assert parts[0]["detail"] == {"answer": "42", "expected": ["42"]}
    assert "error" not in result.detail


def test_weight_defaults_to_one() -> None:
    evaluator = get_evaluator({"name": "weighted", "evaluators": [{"spec": spec_of(0.4)}]})
    assert evaluator.evaluate(make_ctx()).reward == pytest.approx(0.4)


def test_an_unscored_part_makes_the_sum_unscored_with_the_reason() -> None:
    evaluator = get_evaluator(
        {
            "name": "weighted",
            "evaluators": [
                {"spec": spec_of(1.0, "first"), "weight": 0.5},
                {"spec": {"name": "exact_match", "key": "gold"}, "weight": 0.5},  # no "gold"
                {"spec": spec_of(1.0, "last"), "weight": 0.5},
            ],
        }
    )
    result = evaluator.evaluate(make_ctx())
    assert result.reward is None  # never 0.5 + 0 + 0.5
    assert result.detail["error"] == "unscored part"
    assert "part 1 (exact_match)" in result.detail["message"]
    assert "task has no 'gold' field" in result.detail["message"]
    assert [p["reward"] for p in result.detail["parts"]] == [1.0, None, 1.0]
    assert CALLS == ["first", "last"]  # the other parts are still recorded


def test_a_raising_part_is_recorded_with_its_error_type() -> None:
    evaluator = get_evaluator(
        {"name": "weighted", "evaluators": [{"spec": spec_of(1.0)}, {"spec": f"{HERE}:explode"}]}
    )
    result = evaluator.evaluate(make_ctx())
    assert result.reward is None
    assert result.detail["parts"][1]["detail"] == {
        "error": "RuntimeError",
        "message": "scorer bug: division by zero in rubric",
    }
    assert "RuntimeError: scorer bug" in result.detail["message"]


def test_gate_passes_to_then() -> None:
    evaluator = get_evaluator({"name": "gate", "gate": "exact_match", "then": spec_of(0.6, "then")})
    assert isinstance(evaluator, GateEvaluator)
    result = evaluator.evaluate(make_ctx())
    assert result.reward == pytest.approx(0.6)
    assert result.detail["passed"] is True
    assert result.detail["gate"]["reward"] == 1.0
    assert result.detail["then"]["reward"] == pytest.approx(0.6)
    assert CALLS == ["then"]


def test_failed_gate_gives_else_reward_without_running_then() -> None:
    evaluator = get_evaluator(
        {"name": "gate", "gate": "exact_match", "then": spec_of(0.6, "then"), "else_reward": -1}
    )
    result = evaluator.evaluate(make_ctx("ANSWER: 41"))
    assert result.reward == -1.0
    assert result.detail["passed"] is False
    assert "then" not in result.detail
    assert CALLS == []


@pytest.mark.parametrize(("gate_reward", "passed"), [(0.49, False), (0.5, True), (0.9, True)])
def test_gate_threshold(gate_reward: float, passed: bool) -> None:
    evaluator = get_evaluator(
        {"name": "gate", "gate": spec_of(gate_reward), "then": spec_of(0.7), "threshold": 0.5}
    )
    result = evaluator.evaluate(make_ctx())
    assert result.reward == (0.7 if passed else 0.0)
    assert result.detail["passed"] is passed


def test_unscored_gate_or_then_leaves_the_reward_unscored() -> None:
    unscored_gate = get_evaluator({"name": "gate", "gate": spec_of(None), "then": spec_of(1.0)})
    result = unscored_gate.evaluate(make_ctx())
    assert result.reward is None
    assert result.detail["error"] == "unscored gate"
    unscored_then = get_evaluator({"name": "gate", "gate": spec_of(1.0), "then": f"{HERE}:explode"})
    result = unscored_then.evaluate(make_ctx())
    assert result.reward is None
    assert "then (" in result.detail["message"] and "RuntimeError" in result.detail["message"]


def test_composites_nest() -> None:
    evaluator = get_evaluator(
        {
            "name": "gate",
            "gate": "completed",
            "then": {
                "name": "weighted",
                "evaluators": [{"spec": "exact_match", "weight": 2}, {"spec": spec_of(0.5)}],
            },
        }
    )
    assert evaluator.evaluate(make_ctx()).reward == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("parts", "runtime", "final_text", "llm"),
    [
        (["completed", "completed"], False, False, False),
        (["completed", "exact_match"], False, True, False),
        (["completed", {"name": "command", "command": "true"}], True, False, False),
        (["completed", {"name": "llm_judge", "prompt": "{answer}"}], False, True, True),
    ],
)
def test_needs_are_the_or_of_the_parts(
    parts: list[Any], runtime: bool, final_text: bool, llm: bool
) -> None:
    weighted = get_evaluator({"name": "weighted", "evaluators": [{"spec": p} for p in parts]})
    gate = get_evaluator({"name": "gate", "gate": parts[0], "then": parts[1]})
    for evaluator in (weighted, gate):
        assert (evaluator.needs_runtime, evaluator.needs_final_text, evaluator.needs_llm) == (
            runtime,
            final_text,
            llm,
        )


def _nested(depth: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "completed"}
    for _ in range(depth):
        spec = {"name": "weighted", "evaluators": [{"spec": spec}]}
    return spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "weighted"}, "'evaluators' must be a non-empty list"),
        ({"name": "weighted", "evaluators": []}, "'evaluators' must be a non-empty list"),
        ({"name": "weighted", "evaluators": ["completed"]}, "evaluators[0] must be {'spec'"),
        (
            {"name": "weighted", "evaluators": [{"spec": "completed", "weight": True}]},
            "evaluators[0].weight must be a finite number",
        ),
        (
            {"name": "weighted", "evaluators": [{"spec": "completed", "weight": "1"}]},
            "evaluators[0].weight must be a finite number",
        ),
        (
            {"name": "weighted", "evaluators": [{"spec": "completed", "weight": float("inf")}]},
            "evaluators[0].weight must be a finite number",
        ),
        (
            {"name": "weighted", "evaluators": [{"spec": "completed", "wieght": 1}]},
            "unknown keys ['wieght']",
        ),
        (
            {"name": "weighted", "evaluators": [{"spec": "completed"}, {"spec": "nope"}]},
            "weighted: evaluators[1]: unknown evaluator 'nope'",
        ),
        ({"name": "weighted", "evaluators": [{"spec": 3}]}, "must be a name or a mapping"),
        ({"name": "weighted", "evaluators": [{"spec": "completed"}], "x": 1}, "unknown param"),
        ({"name": "gate", "then": "completed"}, "needs 'gate'"),
        ({"name": "gate", "gate": "completed"}, "needs 'then'"),
        (
            {"name": "gate", "gate": "completed", "then": {"name": "regex", "pattern": "("}},
            "gate: then: regex: invalid pattern",
        ),
        (
            {"name": "gate", "gate": "completed", "then": "completed", "else_reward": None},
            "'else_reward' must be a finite number",
        ),
        (
            {"name": "gate", "gate": "completed", "then": "completed", "threshold": "high"},
            "'threshold' must be a finite number",
        ),
        ({"name": "gate", "gate": "completed", "then": "completed", "else": 0}, "unknown param"),
        (_nested(MAX_DEPTH + 1), f"at most {MAX_DEPTH} composites deep"),
        (_nested(5000), f"at most {MAX_DEPTH} composites deep"),
    ],
)
def test_bad_specs_are_value_errors(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        validate_evaluator_spec(spec)
    assert message in str(excinfo.value)


def test_nesting_up_to_the_limit_is_fine() -> None:
    assert get_evaluator(_nested(MAX_DEPTH)).evaluate(make_ctx()).reward == 1.0


def test_evaluate_safely_turns_exceptions_into_unscored_results() -> None:
    result = evaluate_safely(get_evaluator(f"{HERE}:explode"), make_ctx())
    assert result == EvalResult(
        None, {"error": "RuntimeError", "message": "scorer bug: division by zero in rubric"}
    )
    ok = evaluate_safely(get_evaluator("exact_match"), make_ctx())
    assert ok.reward == 1.0
