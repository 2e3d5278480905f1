"""Stage 4, evaluate: score the rollout with the job's evaluator, then release the runtime.

Runs on the node that holds the runtime because some evaluators run test commands inside it: the
agent's own, or with `runtime.evaluation` a fresh one holding a copy of the agent's workspace
(see grading_runtime.py). Runtimes are stopped by the runner once the result is committed (or the
stage failed).

Who is to blame for a grading failure decides its fate: a file the agent swapped for a symlink
(its answer file, a reward file, where the hidden tests go: `UnsafePath`) scores 0, usable, with
the reason in the evaluation detail; the platform's own failure (`GradingUnavailable`, the
database down) is raised, so the stage is retried and ends `runtime_error`, unscored.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any, cast

from sqlalchemy import Table

from polar_mq.calls import AttemptCalls, last_agent_response
from polar_mq.evaluators import (
    EvalContext,
    LlmEndpoint,
    evaluate_safely,
    get_evaluator,
    workspace_refused,
)
from polar_mq.harnesses import get_harness
from polar_mq.lifecycle.transitions import Claimed
from polar_mq.models import Evaluation
from polar_mq.models.base import utcnow
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.safe_files import UnsafePath
from polar_mq.tokens import JUDGE, issue_rollout_token
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import StageOutcome, flush_proxy, open_runtime
from polar_mq.workers.stages.grading_runtime import grading_runtime

logger = logging.getLogger(__name__)
EVALUATIONS = cast(Table, Evaluation.__table__)


def _last_assistant_text(ctx: WorkerContext, claimed: Claimed) -> str | None:
    with ctx.autocommit_factory() as session:  # one read: no BEGIN and COMMIT around it
        response = last_agent_response(session, AttemptCalls.of(claimed.rollout))
    if not response:
        return None
    choices = response.get("choices") or []
    if choices:
        first = choices[0]
        message = first.get("message") or {}
        return message.get("content") or first.get("text")
    return response.get("text")


def final_text(ctx: WorkerContext, claimed: Claimed, runtime: Runtime) -> str | None:
    """The agent's answer from its harness's answer source: the declared file if the agent wrote
    it, else the last assistant message of its main loop (auxiliary calls are not the answer)."""
    answer = get_harness(claimed.spec.harness).answer
    if answer.file is not None:
        try:
            return runtime.download(answer.file).decode(errors="replace")
        except UnsafePath:  # a link in place of the answer: never followed, never skipped
            raise
        except (OSError, ValueError):
            pass
    return _last_assistant_text(ctx, claimed)


def judge_endpoint(ctx: WorkerContext, claimed: Claimed) -> LlmEndpoint:
    """The proxy, with a token that marks the calls as the rollout's judge calls."""
    settings = ctx.settings
    token = issue_rollout_token(
        settings.secret_key, claimed.rollout.id, settings.rollout_token_ttl_s, purpose=JUDGE,
        attempt=claimed.rollout.attempt,
    )  # fmt: skip
    model = claimed.spec.model or settings.served_model or "default"
    return LlmEndpoint(f"{settings.proxy_base_url}/v1", token, model, ctx.http)


def _wait_judge_calls_stored(ctx: WorkerContext, rollout_id: uuid.UUID) -> None:
    """The judge's calls are stored before the rollout completes (whoever reads a completed
    rollout's calls finds them), as the run-agent stage waits for the agent's. A proxy that does
    not answer the flush leaves them to its writer (they are spilled, never dropped); nor is it
    waited for once the rollout was taken from this worker (its result is discarded)."""
    try:
        flush_proxy(ctx, give_up=functools.partial(ctx.leases.lost, rollout_id))
    except Exception as exc:
        logger.warning("judge calls not confirmed stored (proxy flush failed): %r", exc)


def run(ctx: WorkerContext, claimed: Claimed) -> StageOutcome:
    spec = claimed.spec
    rollout = claimed.rollout
    agent_runtime = open_runtime(ctx.settings, spec.runtime, rollout)
    evaluator = get_evaluator(spec.evaluator)
    name = spec.evaluator_name
    prepare_s = spec.timeouts.prepare_s
    answer: str | None = None
    grading: dict[str, Any] = {}
    try:
        answer = final_text(ctx, claimed, agent_runtime) if evaluator.needs_final_text else None
        runtime, grading = grading_runtime(
            ctx.settings, spec.runtime, rollout, agent_runtime, prepare_s
        )  # the agent's own runtime, or a fresh one holding a copy of its workspace
        context = EvalContext(
            rollout_id=str(rollout.id),
            task=claimed.instance,
            runtime=runtime,
            workdir=runtime.workdir,
            agent_exit_code=rollout.agent_exit_code,
            termination_reason=rollout.termination_reason or "completed",
            final_text=answer,
            llm=judge_endpoint(ctx, claimed) if evaluator.needs_llm else None,
        )
        result = evaluate_safely(evaluator, context)  # an evaluator error: reward None, with why
        if evaluator.needs_llm:
            _wait_judge_calls_stored(ctx, rollout.id)
    except UnsafePath as exc:  # the agent swapped a file its grader uses: its failure, scored 0
        result = workspace_refused(exc, str(name))
    return StageOutcome(
        values={"reward": result.reward},
        rows={
            EVALUATIONS: [
                {
                    "rollout_id": rollout.id,
                    "attempt": rollout.attempt,
                    "evaluator": str(name),
                    "reward": result.reward,
                    "detail": result.detail,
                    "created_at": utcnow(),
                }
            ]
        },
        detail={
            "reward": result.reward,
            "final_text": (answer or "")[:200],
            **grading,
        },
    )
