"""Stage 2, run agent: the harness command inside the runtime, the proxy wired in through env vars.

The agent gets a capability token for this rollout as its API key, so every LLM call it makes is
attributed to the rollout by the proxy; the token also carries the job's sampling policy, which the
proxy enforces on those calls (`polar_mq.sampling`). A wall-clock timeout and an optional inactivity
watchdog kill the whole process tree. After the agent exits the proxy's log writer is flushed, so
the build stage sees every call the agent made.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from tenacity import retry, stop_after_attempt, wait_exponential

from polar_mq.harnesses import AgentContext, get_harness
from polar_mq.models import LlmCall, Rollout, TerminationReason
from polar_mq.models.base import utcnow
from polar_mq.sampling import sampling_policy
from polar_mq.tokens import issue_rollout_token
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import StageFailure, StageOutcome, open_runtime
from polar_mq.workers.stages.grading_runtime import start_prewarm
from polar_mq.workers.stages.prepare import TASK_FILE
from polar_mq.workers.transitions import Claimed

SAMPLING_ENV = {"temperature": "POLAR_AGENT_TEMPERATURE", "max_tokens": "POLAR_AGENT_MAX_TOKENS"}


@retry(stop=stop_after_attempt(5), wait=wait_exponential(multiplier=0.2, max=3), reraise=True)
def _flush_proxy(ctx: WorkerContext) -> int:
    headers = {}
    if ctx.settings.proxy_admin_token:
        headers["Authorization"] = f"Bearer {ctx.settings.proxy_admin_token}"
    response = ctx.http.post(f"{ctx.settings.proxy_base_url}/admin/flush", headers=headers)
    response.raise_for_status()
    return int(response.json().get("written", 0))


def _rollout_time_left(
    ctx: WorkerContext, claimed: Claimed, rollout_s: float | None
) -> float | None:
    """Seconds left of the whole-rollout budget, counted from the first prepare claim."""
    if rollout_s is None:
        return None
    with ctx.session_factory() as session:
        started = session.scalar(select(Rollout.started_at).where(Rollout.id == claimed.rollout.id))
    if started is None:
        return float(rollout_s)
    return float(rollout_s) - (utcnow() - started).total_seconds()


def _last_llm_call(ctx: WorkerContext, claimed: Claimed) -> float:
    """The inactivity watchdog's other sign of life: the agent's latest logged LLM call.

    Returned as a `time.monotonic()` stamp. Asked only when the agent has printed nothing for the
    whole inactivity window; a call is visible once the proxy has logged it (after it completed).
    """
    with ctx.session_factory() as session:
        last = session.scalar(
            select(func.max(LlmCall.created_at)).where(
                LlmCall.rollout_id == claimed.rollout.id,
                LlmCall.attempt == claimed.rollout.attempt,
            )
        )
    if last is None:
        return 0.0
    return time.monotonic() - max(0.0, (utcnow() - last).total_seconds())


def _sampling_env(sampling: dict[str, Any]) -> dict[str, str]:
    return {env: str(sampling[key]) for key, env in SAMPLING_ENV.items() if key in sampling}


def run(ctx: WorkerContext, claimed: Claimed) -> StageOutcome:
    spec = claimed.spec
    settings = ctx.settings
    timeouts = spec.get("timeouts", {})
    runtime = open_runtime(settings, spec.get("runtime", {}), claimed.rollout)
    harness = get_harness(spec.get("harness", {"type": "reference"}))
    agent = AgentContext(
        rollout_id=str(claimed.rollout.id),
        instruction=claimed.instance["instruction"],
        task_file=str(runtime.workdir / TASK_FILE),
        workdir=str(runtime.workdir),
        proxy_base_url=f"{settings.proxy_base_url}/v1",
        api_key=issue_rollout_token(
            settings.secret_key,
            claimed.rollout.id,
            settings.agent_token_ttl_s(timeouts),  # dies with the rollout's time limits
            attempt=claimed.rollout.attempt,
            sampling=sampling_policy(spec.get("sampling")),  # enforced by the proxy
        ),
        model=spec.get("model") or settings.served_model or "default",
        python=runtime.python,
        extra_env=_sampling_env(spec.get("sampling", {})),
    )
    log_dir = settings.runtime_root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    timeout = min(float(timeouts.get("agent_s", 600.0)), settings.max_agent_timeout_s)
    rollout_left = _rollout_time_left(ctx, claimed, timeouts.get("rollout_s"))
    if rollout_left is not None:
        if rollout_left <= 0:
            raise StageFailure(TerminationReason.TIMEOUT, "rollout timeout spent before the agent")
        timeout = min(timeout, rollout_left)
    prewarm = start_prewarm(
        settings, spec.get("runtime", {}), claimed.rollout, float(timeouts.get("prepare_s", 300.0))
    )  # the evaluation runtime, when the job grades in its own, is prepared while the agent runs
    try:
        result = runtime.exec(
            harness.command(agent),
            env=harness.env(agent),
            timeout=timeout,
            inactivity_timeout=timeouts.get("inactivity_s", settings.default_inactivity_timeout_s),
            activity=lambda: _last_llm_call(ctx, claimed),
            stdout_path=log_dir / f"{runtime.runtime_id}.log",
        )
    finally:
        grading = prewarm.join() if prewarm is not None else {}
    if result.timed_out or result.inactive:
        reason = TerminationReason.TIMEOUT
    elif result.exit_code == 0:
        reason = TerminationReason.COMPLETED
    else:
        reason = TerminationReason.AGENT_ERROR
    try:
        written = _flush_proxy(ctx)
    except Exception as exc:
        raise StageFailure(
            TerminationReason.BACKEND_ERROR, f"proxy log flush failed: {exc!r}"
        ) from exc
    error = None if reason == TerminationReason.COMPLETED else result.stderr_tail[-2000:]
    return StageOutcome(
        values={
            "termination_reason": reason,
            "agent_exit_code": result.exit_code,
            "error": error,
        },
        detail={
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "inactive": result.inactive,
            "agent_s": round(result.duration_s, 4),
            "proxy_written_total": written,
            **grading,
        },
    )
