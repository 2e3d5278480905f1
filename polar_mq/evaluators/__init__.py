"""Evaluators: turn a finished rollout into a reward, pluggable by name or import path."""

from polar_mq.evaluators.base import (
    EvalContext,
    EvalResult,
    Evaluator,
    GradingUnavailable,
    LlmEndpoint,
    evaluate_safely,
    workspace_refused,
)
from polar_mq.evaluators.command import CommandEvaluator
from polar_mq.evaluators.completed import CompletedEvaluator
from polar_mq.evaluators.composition import GateEvaluator, WeightedEvaluator
from polar_mq.evaluators.llm_judge import LlmJudgeEvaluator
from polar_mq.evaluators.match import ExactMatchEvaluator, RegexEvaluator
from polar_mq.evaluators.registry import (
    EVALUATORS,
    CallableEvaluator,
    get_evaluator,
    validate_evaluator_spec,
)
from polar_mq.evaluators.tests import TestsEvaluator

__all__ = [
    "EVALUATORS",
    "CallableEvaluator",
    "CommandEvaluator",
    "CompletedEvaluator",
    "EvalContext",
    "EvalResult",
    "Evaluator",
    "ExactMatchEvaluator",
    "GateEvaluator",
    "GradingUnavailable",
    "LlmEndpoint",
    "LlmJudgeEvaluator",
    "RegexEvaluator",
    "TestsEvaluator",
    "WeightedEvaluator",
    "evaluate_safely",
    "get_evaluator",
    "validate_evaluator_spec",
    "workspace_refused",
]
