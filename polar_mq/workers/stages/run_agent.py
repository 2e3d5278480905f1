"""Stage 2, run agent: the harness command inside the runtime, the proxy wired in through env vars.

The agent gets a capability token for this rollout as its API key, so every LLM call it makes is
attributed to the rollout by the proxy; the token also carries the job's sampling policy, which the
proxy enforces on those calls (`polar_mq.capability.sampling`). A wall-clock timeout and an optional
inactivity watchdog kill the whole process tree. After the agent exits the stage waits until every
call the agent made is stored, so the build stage sees them all: by the attempt's call receipts in
Redis (`call_receipts`, no round trip to the proxy), or by flushing the proxy's log writer. Not when
the rollout was taken from this worker meanwhile (cancelled, or restarted elsewhere): its result
is discarded, so the stage ends at once instead of waiting on a proxy that may be gone too.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from datetime import datetime
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import select

from polar_mq.calls import AttemptCalls, CallSummary, last_call_at
from polar_mq.capability import receipts as call_receipts
from polar_mq.capability.sampling import sampling_policy
from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.harnesses import AgentContext, get_harness
from polar_mq.harnesses.auxiliary.marking import mark_auxiliary_calls
from polar_mq.harnesses.presets.setup import harness_root_for
from polar_mq.lifecycle.transitions import Claimed, LeaseLost, RolloutRef
from polar_mq.models import Rollout, TerminationReason
from polar_mq.models.base import utcnow
from polar_mq.rollouts.agent_outcome import classify, summarize_calls
from polar_mq.rollouts.artifacts import collect_artifacts
from polar_mq.rollouts.engine_probe import engines_down
from polar_mq.runtimes import ExecResult
from polar_mq.spec import SamplingSpec
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import (
    StageFailure,
    StageRestart,
    flush_proxy,
    open_runtime,
)
from polar_mq.workers.stages.grading_runtime import start_prewarm
from polar_mq.workers.stages.outcomes import AgentRan
from polar_mq.workers.stages.prepare import TASK_FILE

logger = logging.getLogger(__name__)


def wait_calls_stored(
    ctx: WorkerContext, claimed: Claimed, by_receipts: bool, agent_started: datetime
) -> dict[str, Any]:
    """Return once every call the agent made is in the database; `by` says how it was known.

    By the attempt's call receipts when it has them (no round trip to the proxy), else, or when
    they do not add up in time, by the proxy's flush. A failed agent is always flushed: its
    answer's `started_at` tells whether the proxy restarted under the agent (`classify`).
    Receipts that do not add up after the flush of a proxy that restarted under the agent mean
    calls it answered died with the old process: the attempt starts over rather than build a
    trajectory without them.
    """
    rollout = claimed.rollout
    missing: call_receipts.Receipts | None = None
    if by_receipts and ctx.receipts is not None:
        try:
            seen = call_receipts.wait_stored(
                ctx.receipts, rollout.id, rollout.attempt, ctx.settings.call_receipts_wait_s
            )
        except (RedisError, OSError) as exc:
            logger.warning("call receipts unreadable, flushing the proxy instead: %r", exc)
        else:
            if seen.complete:
                return {"by": "receipts", "calls_started": seen.started, "wakeups": seen.wakeups}
            logger.warning(
                "rollout %s attempt %d: %d of %d calls stored after %gs; flushing the proxy",
                rollout.id, rollout.attempt, seen.stored, seen.started,
                ctx.settings.call_receipts_wait_s,
            )  # fmt: skip
            missing = seen
    taken = functools.partial(ctx.leases.lost, rollout.id)  # cancelled meanwhile: stop waiting
    try:
        flushed = {**flush_proxy(ctx, give_up=taken), "by": "flush"}
    except Exception as exc:  # the attempt's calls may be lost with the proxy: start over
        raise StageRestart(
            TerminationReason.BACKEND_ERROR, f"proxy log flush failed: {exc!r}"
        ) from exc
    restarted = float(flushed.get("started_at") or 0) > agent_started.timestamp()
    if missing is not None and restarted and ctx.receipts is not None:
        try:
            after = call_receipts.read(ctx.receipts, rollout.id, rollout.attempt)
        except (RedisError, OSError):  # unreadable again: the flush is what we know
            return flushed
        if not after.complete:
            raise StageRestart(
                TerminationReason.BACKEND_ERROR,
                f"the proxy restarted while the agent ran: {after.stored} of its "
                f"{after.started} calls stored, the others lost with the old process",
            )
    return flushed


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
        last = last_call_at(session, AttemptCalls.of(claimed.rollout))
    if last is None:
        return 0.0
    return time.monotonic() - max(0.0, (utcnow() - last).total_seconds())


def rollout_seed(seed: int, task_index: int, sample_index: int) -> int:
    """The sampling seed of one rollout of a job seeded with `seed` (0 .. 2**31 - 1).

    One seed per rollout, not the job's: the samples of a group share their prompt, so one seed
    would make them the same reply. Hashed rather than summed so that neighbouring job seeds do
    not share rollouts' seeds; the same job seed, group and sample give the same seed on a retry.
    """
    digest = hashlib.sha256(f"{seed}/{task_index}/{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _sampling_env(sampling: SamplingSpec, rollout: RolloutRef) -> dict[str, str]:
    """The job's sampling as the agent's environment, for agents that send it themselves."""
    env = {}
    if sampling.temperature is not None:
        env["POLAR_AGENT_TEMPERATURE"] = str(sampling.temperature)
    if sampling.max_tokens is not None:
        env["POLAR_AGENT_MAX_TOKENS"] = str(sampling.max_tokens)
    if sampling.seed is not None:
        seed = rollout_seed(sampling.seed, rollout.task_index, rollout.sample_index)
        env["POLAR_AGENT_SEED"] = str(seed)
    return env


def _error_text(result: ExecResult, limit: int = 2000) -> str:
    """Why the agent failed, in its own words: stderr's tail, and stdout's (some harnesses, such
    as Claude Code, print their errors there)."""
    parts = [
        f"[{name}] {text.strip()[-limit:]}"
        for name, text in (("stderr", result.stderr_tail), ("stdout", result.stdout_tail))
        if text.strip()
    ]
    return "\n".join(parts) if parts else f"agent exited {result.exit_code}"


def _open_receipts(ctx: WorkerContext, claimed: Claimed) -> bool:
    """Whether this attempt's calls are receipted: only when its mark could be set."""
    if ctx.receipts is None:
        return False
    try:
        call_receipts.open_attempt(ctx.receipts, claimed.rollout.id, claimed.rollout.attempt)
    except (RedisError, OSError) as exc:  # Redis away: the flush after the agent, as before
        logger.warning("call receipts unavailable for this attempt, flushing after it: %r", exc)
        return False
    return True


def run(ctx: WorkerContext, claimed: Claimed) -> AgentRan:
    began = time.monotonic()
    spec = claimed.spec
    settings = ctx.settings
    timeouts = spec.timeouts
    runtime = open_runtime(settings, spec.runtime, claimed.rollout)
    harness = get_harness(spec.harness)
    receipts = _open_receipts(ctx, claimed)
    agent = AgentContext(
        rollout_id=str(claimed.rollout.id),
        instruction=claimed.instance.instruction,
        task_file=str(runtime.workdir / TASK_FILE),
        workdir=str(runtime.workdir),
        # the sandbox's own way to the proxy (a relay under network proxy_only)
        proxy_base_url=runtime.agent_proxy_url(f"{settings.proxy_base_url}/v1"),
        api_key=issue_rollout_token(
            settings.secret_key,
            claimed.rollout.id,
            settings.agent_token_ttl_s(timeouts),  # dies with the rollout's time limits
            attempt=claimed.rollout.attempt,
            sampling=sampling_policy(spec.sampling.root),  # enforced by the proxy
            receipts=receipts,  # the proxy counts the calls: no flush after the agent
            unbudgeted=spec.max_tokens_per_rollout is None,  # the proxy need not look it up
            chat_only=spec.tito == "off",  # the job keeps its calls off token-in/token-out
        ),
        model=spec.model or settings.served_model or "default",
        python=runtime.python,
        extra_env=_sampling_env(spec.sampling, claimed.rollout),
        harness_root=harness_root_for(spec.runtime, settings.harness_root),
    )
    for path, text in harness.files(agent).items():
        runtime.upload(text.encode(), path)  # the harness's config, inside the workspace
    log_dir = settings.runtime_root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_dir.chmod(0o700)  # every agent's output, tokens included: not for other agents' eyes
    log_path = log_dir / f"{runtime.runtime_id}.log"
    timeout = min(timeouts.agent_s, settings.max_agent_timeout_s)
    rollout_left = _rollout_time_left(ctx, claimed, timeouts.rollout_s)
    if rollout_left is not None:
        if rollout_left <= 0:
            raise StageFailure(TerminationReason.TIMEOUT, "rollout timeout spent before the agent")
        timeout = min(timeout, rollout_left)
    # the evaluation runtime, when the job grades in its own, is prepared while the agent runs
    prewarm = start_prewarm(settings, spec.runtime, claimed.rollout, timeouts.prepare_s)
    agent_started = utcnow()
    exec_at = time.monotonic()
    try:
        result = runtime.exec(
            harness.command(agent),
            env=harness.env(agent),
            timeout=timeout,
            inactivity_timeout=(
                timeouts.inactivity_s
                if timeouts.inactivity_s is not None
                else settings.default_inactivity_timeout_s
            ),
            activity=lambda: _last_llm_call(ctx, claimed),
            stdout_path=log_path,
        )
    finally:
        grading = prewarm.join() if prewarm is not None else {}
    if ctx.leases.lost(claimed.rollout.id):  # cancelled or taken under the agent: all discarded
        raise LeaseLost(f"rollout {claimed.rollout.id} was taken from this worker under its agent")
    flush_at = time.monotonic()
    flushed = wait_calls_stored(ctx, claimed, result.ok and receipts, agent_started)
    flushed_at = time.monotonic()
    rollout = claimed.rollout
    if flushed.get("calls_started") == 0:  # the receipts say no call was made: nothing to read
        calls = CallSummary(0, None)
    else:
        calls = summarize_calls(  # a read: autocommit spares the BEGIN and ROLLBACK
            ctx.autocommit_engine, rollout.id, rollout.attempt, rollout.created_at
        )
    budget = spec.max_tokens_per_rollout
    outcome = classify(
        result, calls, agent_started, flushed.get("started_at"), budget,
        engine_down=lambda: engines_down(settings.proxy_base_url),
    )  # fmt: skip
    if outcome.infrastructure:  # never scored: the platform failed, not the policy
        message = f"{_error_text(result)}\n{outcome.why}"  # the why last: tails are kept
        if outcome.restart:
            raise StageRestart(outcome.reason, message)  # transient: a new attempt
        raise StageFailure(outcome.reason, message)
    reason = outcome.reason
    rules = harness.auxiliary_rules
    auxiliary = (
        mark_auxiliary_calls(ctx.session_factory, rollout.id, rollout.attempt, rules)
        if rules
        else 0
    )
    artifacts = collect_artifacts(
        runtime, rollout.id, rollout.attempt, log_path=log_path, files=harness.artifacts,
        cap=settings.artifact_max_bytes,
    )  # fmt: skip
    return AgentRan(
        termination_reason=reason,
        exit_code=result.exit_code,
        error=None if reason == TerminationReason.COMPLETED else _error_text(result),
        timed_out=result.timed_out,
        inactive=result.inactive,
        agent_s=round(result.duration_s, 4),
        setup_s=round(exec_at - began, 4),
        reap_s=round(flush_at - exec_at - result.duration_s, 4),
        flush_s=round(flushed_at - flush_at, 4),
        collect_s=round(time.monotonic() - flushed_at, 4),
        proxy_written_total=flushed.get("written", 0),
        calls_stored_by=flushed["by"],
        calls_started=flushed.get("calls_started"),
        wakeups=flushed.get("wakeups"),
        agent_calls=calls.calls,
        auxiliary_calls=auxiliary,
        artifacts=artifacts,
        grading=grading,
    )
