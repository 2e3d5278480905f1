"""The evaluator interface: what a scorer sees of a finished rollout and what it returns.

Evaluators are built from a job's spec once and applied to many rollouts, so parameters are
checked in the constructor (a bad spec fails at submission) and `evaluate` only scores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from polar_mq.runtimes.base import Runtime


@dataclass(frozen=True, slots=True)
class LlmEndpoint:
    """How an evaluator reaches a model: the proxy's OpenAI-compatible `base_url` (ending in /v1)
    with a token minted for this rollout with purpose "judge", so its calls go through the same
    backends and are logged, marked as never to be trained on."""

    base_url: str
    api_key: str
    model: str
    http: httpx.Client


@dataclass(frozen=True, slots=True)
class EvalContext:
    """A finished rollout as evaluators see it.

    `final_text` is the agent's answer file if it wrote one, else its last assistant message.
    `runtime` is still alive during evaluation so test commands can run where the agent worked.
    """

    rollout_id: str
    task: Mapping[str, Any]
    runtime: Runtime | None
    workdir: Path | None
    agent_exit_code: int | None
    termination_reason: str
    final_text: str | None
    llm: LlmEndpoint | None = None
    """Set by the evaluate stage when the evaluator `needs_llm`."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    """A reward (None = could not be scored, never silently 0) and what led to it."""

    reward: float | None
    detail: dict[str, Any] = field(default_factory=dict)


class Evaluator(ABC):
    """Scores one rollout. `needs_runtime` tells the evaluate stage to keep the sandbox up;
    `needs_final_text` whether to read the agent's answer (a file read or a query) first;
    `needs_llm` whether to hand it a judge endpoint (`EvalContext.llm`)."""

    name: ClassVar[str]
    needs_runtime: bool = False
    needs_final_text: bool = True
    needs_llm: bool = False

    @abstractmethod
    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """Compute the reward; raise only on a bug, report task problems in the result."""


def evaluate_safely(evaluator: Evaluator, ctx: EvalContext) -> EvalResult:
    """`evaluator.evaluate(ctx)`, with an exception turned into an unscored result with its reason.

    A scorer's bug or a user callable's error is about this rollout's reward, not the
    infrastructure: the rollout keeps its trajectory and the reason is stored with the evaluation.
    """
    try:
        return evaluator.evaluate(ctx)
    except Exception as exc:  # any evaluator code, including user callables
        return EvalResult(None, {"error": type(exc).__name__, "message": str(exc)[:2000]})
