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
from polar_mq.runtimes.safe_files import UnsafePath

WORKSPACE_TAMPERED = "workspace_tampered"
"""The evaluation detail's `error` when a grader path was swapped (see `workspace_refused`)."""


class GradingUnavailable(RuntimeError):
    """The platform could not grade: its own file is missing or unreadable on this node, a
    service it needs is down. An infrastructure failure, never the policy's: it propagates out of
    the evaluate stage, which is retried and, when that does not help, ends `runtime_error`
    (unscored)."""


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

    def required_task_fields(self) -> frozenset[str]:
        """The task fields this evaluator cannot score without (`exact_match`: its `key`).

        Checked on every task at submit (`polar_mq.jobs.evaluator_choice`): a task lacking one
        would end every rollout of it unscored, or worse, scored by a default. None by default.
        """
        return frozenset()

    @abstractmethod
    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """Compute the reward; raise only on a bug, report task problems in the result."""


def evaluate_safely(evaluator: Evaluator, ctx: EvalContext) -> EvalResult:
    """`evaluator.evaluate(ctx)`, with an exception turned into an unscored result with its reason.

    A scorer's bug or a user callable's error is about this rollout's reward, not the
    infrastructure: the rollout keeps its trajectory and the reason is stored with the evaluation.
    Two exceptions pass through, to be judged for the whole evaluation (a composite's part must
    not hide them): `UnsafePath` (the agent swapped a file the grader uses: the evaluate stage
    scores 0, see `workspace_refused`) and `GradingUnavailable` (the platform's failure).
    """
    try:
        return evaluator.evaluate(ctx)
    except (UnsafePath, GradingUnavailable):
        raise
    except Exception as exc:  # any evaluator code, including user callables
        return EvalResult(None, {"error": type(exc).__name__, "message": str(exc)[:2000]})


def workspace_refused(exc: UnsafePath, evaluator: str) -> EvalResult:
    """The verdict on a workspace in which the agent swapped a file the grader reads or writes
    (a symlink to `/etc/passwd`, to a reward file of its own, over the hidden tests): the
    policy's failure, scored 0 and kept in the statistics, with what was refused."""
    return EvalResult(
        0.0, {"error": WORKSPACE_TAMPERED, "evaluator": evaluator, "message": str(exc)[:2000]}
    )
