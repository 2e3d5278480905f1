"""Composite evaluators: `weighted` (a weighted sum of parts) and `gate` (score only past a gate).

Specs:
- `{"name": "weighted", "evaluators": [{"spec": <evaluator spec>, "weight": 0.7}, ...]}`
- `{"name": "gate", "gate": <spec>, "then": <spec>, "else_reward": 0.0, "threshold": 1.0}`
  (e.g. run the tests; only when they pass ask a judge about the code's quality).

A part that cannot be scored (reward None) makes the whole reward None with the part's reason: a
missing term silently counted as 0 would teach the policy something the task never said. Parts are
built by the registry (passed in as `build`), which keeps this module free of the lookup rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator, evaluate_safely

Build = Callable[[Any], Evaluator]
"""Builds one part from its spec (the registry's `get_evaluator`, one nesting level deeper)."""


def _label(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return str(spec["name"])
    return "?"


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _build_part(build: Build, spec: Any, where: str) -> Evaluator:
    try:
        return build(spec)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _part_record(name: str, result: EvalResult, **extra: Any) -> dict[str, Any]:
    return {"name": name, **extra, "reward": result.reward, "detail": result.detail}


class _Composite(Evaluator):
    """Needs whatever any of its parts needs."""

    _parts: tuple[Evaluator, ...] = ()

    def _needs_from(self, parts: list[Evaluator]) -> None:
        self._parts = tuple(parts)
        self.needs_runtime = any(part.needs_runtime for part in parts)
        self.needs_final_text = any(part.needs_final_text for part in parts)
        self.needs_llm = any(part.needs_llm for part in parts)

    def required_task_fields(self) -> frozenset[str]:
        return frozenset().union(*(part.required_task_fields() for part in self._parts))


class WeightedEvaluator(_Composite):
    """sum(weight_i * reward_i); None when any part is None. Weights may be negative (penalties)."""

    name = "weighted"

    def __init__(self, parts: list[tuple[str, Evaluator, float]]) -> None:
        if not parts:
            raise ValueError("weighted: needs at least one part")
        self.parts = parts
        self._needs_from([evaluator for _, evaluator, _ in parts])

    @classmethod
    def from_spec(cls, params: Mapping[str, Any], build: Build) -> WeightedEvaluator:
        unknown = set(params) - {"evaluators"}
        if unknown:
            raise ValueError(f"weighted: unknown parameters {sorted(unknown)}")
        items = params.get("evaluators")
        if not isinstance(items, list) or not items:
            raise ValueError("weighted: 'evaluators' must be a non-empty list of {spec, weight}")
        parts: list[tuple[str, Evaluator, float]] = []
        for i, item in enumerate(items):
            where = f"weighted: evaluators[{i}]"
            if not isinstance(item, Mapping) or "spec" not in item:
                raise ValueError(
                    f"{where} must be {{'spec': <evaluator spec>, 'weight': <number>}}"
                )
            if set(item) - {"spec", "weight"}:
                raise ValueError(f"{where}: unknown keys {sorted(set(item) - {'spec', 'weight'})}")
            weight = _number(item.get("weight", 1.0), f"{where}.weight")
            parts.append((_label(item["spec"]), _build_part(build, item["spec"], where), weight))
        return cls(parts)

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        records: list[dict[str, Any]] = []
        total = 0.0
        missing: list[str] = []
        for i, (name, evaluator, weight) in enumerate(self.parts):
            result = evaluate_safely(evaluator, ctx)
            records.append(_part_record(name, result, weight=weight))
            if result.reward is None:
                missing.append(f"part {i} ({name}): {_reason(result)}")
            else:
                total += weight * result.reward
        if missing:
            return EvalResult(None, {"error": "unscored part", "message": "; ".join(missing),
                                     "parts": records})  # fmt: skip
        return EvalResult(total, {"parts": records})


class GateEvaluator(_Composite):
    """`then`'s reward when the gate's reward reaches `threshold`, else `else_reward`.

    `then` is not run when the gate fails (no judge call for code that fails its tests). A gate
    that cannot be scored leaves the whole reward None.
    """

    name = "gate"

    def __init__(
        self,
        gate: tuple[str, Evaluator],
        then: tuple[str, Evaluator],
        else_reward: float = 0.0,
        threshold: float = 1.0,
    ) -> None:
        self.gate = gate
        self.then = then
        self.else_reward = _number(else_reward, "gate: 'else_reward'")
        self.threshold = _number(threshold, "gate: 'threshold'")
        self._needs_from([gate[1], then[1]])

    @classmethod
    def from_spec(cls, params: Mapping[str, Any], build: Build) -> GateEvaluator:
        unknown = set(params) - {"gate", "then", "else_reward", "threshold"}
        if unknown:
            raise ValueError(f"gate: unknown parameters {sorted(unknown)}")
        for key in ("gate", "then"):
            if key not in params:
                raise ValueError(f"gate: needs '{key}': <evaluator spec>")
        gate = (_label(params["gate"]), _build_part(build, params["gate"], "gate: gate"))
        then = (_label(params["then"]), _build_part(build, params["then"], "gate: then"))
        return cls(gate, then, params.get("else_reward", 0.0), params.get("threshold", 1.0))

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        gate_name, gate = self.gate
        gate_result = evaluate_safely(gate, ctx)
        detail: dict[str, Any] = {"gate": _part_record(gate_name, gate_result)}
        if gate_result.reward is None:
            reason = f"gate ({gate_name}): {_reason(gate_result)}"
            return EvalResult(None, {"error": "unscored gate", "message": reason, **detail})
        detail["passed"] = gate_result.reward >= self.threshold
        if not detail["passed"]:
            return EvalResult(self.else_reward, detail)
        then_name, then = self.then
        then_result = evaluate_safely(then, ctx)
        detail["then"] = _part_record(then_name, then_result)
        if then_result.reward is None:
            detail.update(
                error="unscored part", message=f"then ({then_name}): {_reason(then_result)}"
            )
        return EvalResult(then_result.reward, detail)


def _reason(result: EvalResult) -> str:
    """Why a part has no reward, from the conventions its detail follows."""
    error = result.detail.get("error")
    message = result.detail.get("message")
    if error and message:
        return f"{error}: {message}"
    return str(error or message or "no reward")
