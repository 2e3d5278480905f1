"""Stage 2, run agent: the harness command inside the runtime, the proxy wired in through env vars.

The agent gets a capability token for this rollout as its API key, so every LLM call it makes is
attributed to the rollout by the proxy. A wall-clock timeout and an optional inactivity watchdog
kill the whole process tree. After the agent exits the proxy's log writer is flushed, so the build
stage sees every call the agent made.
"""

from __future__ import annotations

from typing import Any

from tenacity import retry, stop_after_attempt, wait_exponential

from polar_mq.harnesses import AgentContext, get_harness
from polar_mq.models import TerminationReason
from polar_mq.tokens import issue_rollout_token
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import StageFailure, StageOutcome, open_runtime
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
            settings.secret_key, claimed.rollout.id, settings.rollout_token_ttl_s
        ),
        model=spec.get("model") or settings.served_model or "default",
        extra_env=_sampling_env(spec.get("sampling", {})),
    )
    log_dir = settings.runtime_root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    result = runtime.exec(
        harness.command(agent),
        env=harness.env(agent),
        timeout=min(float(timeouts.get("agent_s", 600.0)), settings.max_agent_timeout_s),
        inactivity_timeout=timeouts.get("inactivity_s"),
        stdout_path=log_dir / f"{runtime.runtime_id}.log",
    )
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
        },
    )
