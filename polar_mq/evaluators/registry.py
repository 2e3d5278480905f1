"""Evaluator lookup: built-in names, composites (`weighted`, `gate`), `python` callables,
`package.module:attr` import paths and entry points (group `polar_mq.evaluators`).

Import paths are resolved only from the allow-list (`polar_mq.infra.imports`): a job cannot make the
API or a worker import an arbitrary module (`"os:system"` is a 4xx at submit).

The API validates a job's evaluator spec by building it once, so every error a worker could hit
while constructing the evaluator becomes a ValueError (a 4xx) at submission time instead. Composite
specs nest; the depth is bounded so a pathological spec is a 4xx, not a RecursionError.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator
from polar_mq.evaluators.command import CommandEvaluator
from polar_mq.evaluators.completed import CompletedEvaluator
from polar_mq.evaluators.composition import Build, GateEvaluator, WeightedEvaluator
from polar_mq.evaluators.llm_judge import LlmJudgeEvaluator
from polar_mq.evaluators.match import ExactMatchEvaluator, RegexEvaluator
from polar_mq.evaluators.tests import TestsEvaluator
from polar_mq.infra.imports import EVALUATOR_GROUP, check_import_path, entry_point_path

EVALUATORS: dict[str, type[Evaluator]] = {
    cls.name: cls
    for cls in (
        CompletedEvaluator,
        ExactMatchEvaluator,
        RegexEvaluator,
        CommandEvaluator,
        LlmJudgeEvaluator,
        TestsEvaluator,
    )
}
COMPOSITES: dict[str, Callable[[Mapping[str, Any], Build], Evaluator]] = {
    WeightedEvaluator.name: WeightedEvaluator.from_spec,
    GateEvaluator.name: GateEvaluator.from_spec,
}
MAX_DEPTH = 8
"""How deeply composite specs may nest."""
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class CallableEvaluator(Evaluator):
    """Adapts `fn(ctx, **params)` returning an EvalResult, a number, a bool or None."""

    name = "python"
    needs_runtime = True  # user code may well look inside the sandbox

    def __init__(self, fn: Callable[..., Any], params: Mapping[str, Any] | None = None) -> None:
        self.fn = fn
        self.params = dict(params or {})
        try:
            inspect.signature(fn).bind(None, **self.params)
        except TypeError as exc:
            raise ValueError(f"python evaluator {fn!r}: bad parameters: {exc}") from exc
        except ValueError:  # no signature available (some builtins): checked at call time
            pass

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        return as_result(self.fn(ctx, **self.params))


def as_result(value: Any) -> EvalResult:
    """Accept the natural return types of a user scoring function."""
    if isinstance(value, EvalResult):
        return value
    if value is None:
        return EvalResult(None, {})
    if isinstance(value, bool | int | float):
        reward = float(value)
        if not math.isfinite(reward):
            raise ValueError(f"evaluator returned a non-finite reward: {value!r}")
        return EvalResult(reward, {})
    raise TypeError(f"evaluator returned {type(value).__name__}; expected EvalResult or a number")


def get_evaluator(spec: Mapping[str, Any] | str, depth: int = 0) -> Evaluator:
    """Build an evaluator from a bare name, `{"name": ..., **params}` or an import path."""
    name, params = _split(spec)
    if name in EVALUATORS:
        return _construct(EVALUATORS[name], params, name)
    if name in COMPOSITES:
        if depth >= MAX_DEPTH:
            raise ValueError(f"evaluator specs may nest at most {MAX_DEPTH} composites deep")
        return COMPOSITES[name](params, lambda part: get_evaluator(part, depth + 1))
    if name == CallableEvaluator.name:
        target = params.pop("callable", None)
        if not isinstance(target, str):
            raise ValueError("python evaluator needs 'callable': 'package.module:function'")
        return _from_import_path(target, params)
    if ":" in name:
        return _from_import_path(name, params)
    registered = entry_point_path(name, EVALUATOR_GROUP)
    if registered is not None:
        return _from_import_path(registered, params)
    known = ", ".join(sorted([*EVALUATORS, *COMPOSITES, CallableEvaluator.name]))
    raise ValueError(
        f"unknown evaluator {name!r}; known evaluators: {known}, "
        "or an import path 'package.module:attr'"
    )


def validate_evaluator_spec(spec: Any) -> None:
    """Raise ValueError now for a spec that would fail in the evaluate stage later."""
    get_evaluator(spec)


def _split(spec: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"evaluator spec must be a name or a mapping, got {type(spec).__name__}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("evaluator spec needs a 'name'")
    return name, {key: value for key, value in spec.items() if key != "name"}


def _construct(factory: Callable[..., Evaluator], params: dict[str, Any], label: str) -> Evaluator:
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"evaluator {label!r}: bad parameters: {exc}") from exc


def _from_import_path(path: str, params: dict[str, Any]) -> Evaluator:
    """Resolve `module:attr` to an Evaluator class, a class with `evaluate`, or a callable."""
    if not _IMPORT_PATH.fullmatch(path):
        raise ValueError(f"evaluator import path {path!r} must look like 'package.module:attr'")
    check_import_path(path, EVALUATOR_GROUP, "evaluator")
    module_name, attr_path = path.split(":", 1)
    try:
        target: Any = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except Exception as exc:  # user code: any import-time failure is a bad spec
        raise ValueError(f"cannot import evaluator {path!r}: {exc}") from exc
    if inspect.isclass(target):
        instance = _construct(target, params, path)
        if isinstance(instance, Evaluator):
            return instance
        method = getattr(instance, "evaluate", None)
        if not callable(method):
            raise ValueError(f"evaluator class {path!r} has no evaluate(ctx) method")
        return CallableEvaluator(method)
    if callable(target):
        return CallableEvaluator(target, params)
    raise ValueError(f"evaluator {path!r} is neither a class nor a callable")
