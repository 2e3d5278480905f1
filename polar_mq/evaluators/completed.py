"""`completed`: reward the agent for ending on its own, cleanly (a smoke-test reward)."""

from __future__ import annotations

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator


class CompletedEvaluator(Evaluator):
    """1.0 when the agent exited 0 and the rollout ended as "completed", else 0.0."""

    name = "completed"
    needs_final_text = False

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        ok = ctx.agent_exit_code == 0 and ctx.termination_reason == "completed"
        detail = {"exit_code": ctx.agent_exit_code, "termination_reason": ctx.termination_reason}
        return EvalResult(1.0 if ok else 0.0, detail)
