"""Stage 4, evaluate: score the rollout with the job's evaluator, then release the runtime.

Runs on the node that holds the runtime because some evaluators run test commands inside it: the
agent's own, or with `runtime.evaluation` a fresh one holding a copy of the agent's workspace
(see grading_runtime.py). Runtimes are stopped by the runner once the result is committed (or the
stage failed).

A `tests` evaluator in `diff` mode on a task with a `repo` grades from what the agent changed, not
from where it ran (`grading_runtime.diff_grading_runtime`): the base is the commit prepare
recorded in its own event, the agent's runtime is stopped first, and the evaluation detail says
which files of the diff were dropped (`dropped`, and `tampering` when any was). The agent's whole
diff is stored as the `workspace.diff` artifact, replacing the one the run-agent stage took
against the workspace's own (agent-movable) base ref.

Who is to blame for a grading failure decides its fate: a file the agent swapped for a symlink
(its answer file, a reward file, where the hidden tests go: `UnsafePath`) scores 0, usable, with
the reason in the evaluation detail; the platform's own failure (`GradingUnavailable`, the
database down) is raised, so the stage is retried and ends `runtime_error`, unscored.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any

from sqlalchemy import delete, select

from polar_mq.calls import AttemptCalls, last_agent_response
from polar_mq.capability.tokens import JUDGE, issue_rollout_token
from polar_mq.evaluators import (
    EvalContext,
    EvalResult,
    Evaluator,
    GradingUnavailable,
    LlmEndpoint,
    evaluate_safely,
    get_evaluator,
    workspace_refused,
)
from polar_mq.evaluators.tests import TestsEvaluator
from polar_mq.harnesses import get_harness
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed
from polar_mq.models import Event, EventKind, RolloutArtifact, TerminationReason
from polar_mq.rollouts.artifacts import DIFF, diff_row
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.safe_files import UnsafePath
from polar_mq.swe import grading as saved_diff
from polar_mq.swe.hidden_tests import HiddenTestsError
from polar_mq.swe.spec import parse_repo
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import StageFailure, flush_proxy, open_runtime
from polar_mq.workers.stages.grading_runtime import (
    DiffGrading,
    PatchRefused,
    diff_grading_runtime,
    grading_runtime,
)
from polar_mq.workers.stages.outcomes import Evaluated

logger = logging.getLogger(__name__)


def _last_assistant_text(ctx: WorkerContext, claimed: Claimed) -> str | None:
    with ctx.autocommit_factory() as session:  # one read: no BEGIN and COMMIT around it
        response = last_agent_response(session, AttemptCalls.of(claimed.rollout))
    if not response:
        return None
    choices = response.get("choices") or []
    if choices:
        first = choices[0]
        message = first.get("message") or {}
        value = message.get("content") or first.get("text")
    else:
        value = response.get("text")
    return value if isinstance(value, str) else None


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


def recorded_base(ctx: WorkerContext, claimed: Claimed) -> str:
    """The commit this attempt's prepare checked out, from its `finished` event: outside the
    workspace, where the agent cannot move it."""
    rollout = claimed.rollout
    with ctx.autocommit_factory() as session:
        details: list[dict[str, Any]] = session.scalars(
            select(Event.detail)
            .where(
                Event.rollout_id == rollout.id,
                Event.attempt == rollout.attempt,
                Event.stage == Stage.PREPARE.value,
                Event.kind == EventKind.FINISHED,
            )
            .order_by(Event.id.desc())
            .limit(1)
        ).all()  # type: ignore[assignment]
    for detail in details:
        commit = ((detail or {}).get("runtime") or {}).get("repo", {}).get("commit")
        if isinstance(commit, str) and commit:
            return commit
    raise StageFailure(
        TerminationReason.RUNTIME_ERROR, "no checked-out commit recorded by prepare to diff against"
    )


def _diff_mode(evaluator: Evaluator, claimed: Claimed) -> TestsEvaluator | None:
    """The `tests` evaluator that grades this task from the diff: the job's own, or a part of a
    composite (`weighted` parts, a `gate`'s gate and branch), whose other parts then see the same
    grading runtime."""
    if isinstance(evaluator, TestsEvaluator):
        return evaluator if evaluator.grades_from_diff(claimed.instance.stored) else None
    parts: list[Any] = list(getattr(evaluator, "parts", None) or [])
    parts += [getattr(evaluator, name, None) for name in ("gate", "then")]
    for entry in parts:  # a weighted part is (label, evaluator, weight)
        for part in entry if isinstance(entry, tuple) else (entry,):
            if isinstance(part, Evaluator) and (found := _diff_mode(part, claimed)) is not None:
                return found
    return None


def _prepare_diff_grading(
    ctx: WorkerContext, claimed: Claimed, evaluator: TestsEvaluator, agent_runtime: Runtime
) -> DiffGrading:
    spec = claimed.spec
    task = claimed.instance
    try:
        protected = evaluator.protected_patterns(task.stored, str(agent_runtime.workdir))
    except HiddenTestsError as exc:  # the grader's own files: the platform's failure
        raise GradingUnavailable(str(exc)) from exc
    try:
        return diff_grading_runtime(
            ctx.settings, spec.runtime, claimed.rollout, agent_runtime, parse_repo(task.repo),
            recorded_base(ctx, claimed), protected, spec.timeouts.prepare_s,
        )  # fmt: skip
    except saved_diff.DiffUnavailable as exc:
        raise GradingUnavailable(str(exc)) from exc


def _diff_detail(graded: DiffGrading, evaluator: TestsEvaluator) -> dict[str, Any]:
    """What the evaluation records about the diff it graded: all the agent changed (the text
    unless the evaluator's `diff` is off, up to its `max_diff_chars`), what was applied, what was
    dropped and why (`tampering` only when something was)."""
    diff, filtered = graded.diff, graded.filtered
    text = diff.patch.decode("utf-8", errors="replace") if evaluator.diff else ""
    dropped = [d.as_dict() for d in filtered.dropped]
    return {
        **(
            {
                "diff": text[: evaluator.max_diff_chars],
                "diff_truncated": len(text) > evaluator.max_diff_chars,
            }
            if evaluator.diff
            else {}
        ),
        "diff_files": diff.files,
        "diff_base": diff.base,
        "diff_applied": filtered.kept,
        "dropped": dropped,
        **({"tampering": [d["path"] for d in dropped]} if dropped else {}),
    }


def _replace_diff_artifact(ctx: WorkerContext, claimed: Claimed) -> None:
    """Remove the run-agent stage's `workspace.diff` (taken against the agent-movable ref) so
    the graded one takes its name; a redelivered evaluate finds nothing left to remove."""
    rollout = claimed.rollout
    with ctx.session_factory() as session, session.begin():
        session.execute(
            delete(RolloutArtifact).where(
                RolloutArtifact.rollout_id == rollout.id,
                RolloutArtifact.attempt == rollout.attempt,
                RolloutArtifact.name == DIFF,
            )
        )


def run(ctx: WorkerContext, claimed: Claimed) -> Evaluated:
    spec = claimed.spec
    rollout = claimed.rollout
    agent_runtime = open_runtime(ctx.settings, spec.runtime, rollout)
    evaluator = get_evaluator(spec.evaluator)
    name = spec.evaluator_name
    prepare_s = spec.timeouts.prepare_s
    answer: str | None = None
    grading: dict[str, Any] = {}
    diff_evaluator = _diff_mode(evaluator, claimed)
    graded: DiffGrading | None = None
    artifacts: list[dict[str, Any]] = []
    try:
        answer = final_text(ctx, claimed, agent_runtime) if evaluator.needs_final_text else None
        if diff_evaluator is not None:
            graded = _prepare_diff_grading(ctx, claimed, diff_evaluator, agent_runtime)
            runtime, grading = graded.runtime, graded.stage_detail
            _replace_diff_artifact(ctx, claimed)
            artifacts.append(
                diff_row(
                    rollout.id, rollout.attempt, graded.diff.patch, ctx.settings.artifact_max_bytes
                )
            )
        else:
            runtime, grading = grading_runtime(
                ctx.settings, spec.runtime, rollout, agent_runtime, prepare_s
            )  # the agent's own runtime, or a fresh one holding a copy of its workspace
        context = EvalContext(
            rollout_id=str(rollout.id),
            task=claimed.instance.as_dict(),  # a copy: the view is shared by the process
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
    except PatchRefused as exc:  # its diff does not apply to the commit it started from
        result = EvalResult(0.0, {"error": "diff_refused", "message": str(exc)[-2000:]})
    if graded is not None and diff_evaluator is not None:
        result = EvalResult(
            result.reward, {**_diff_detail(graded, diff_evaluator), **result.detail}
        )
        grading["tampering"] = len(graded.filtered.dropped)
    return Evaluated(rollout.id, rollout.attempt, str(name), result, answer, grading, artifacts)
