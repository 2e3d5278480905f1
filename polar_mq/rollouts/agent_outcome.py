"""Why an agent run ended, judged from the platform's side rather than from the exit code.

An agent that dies because the proxy or the engine went away exits non-zero like one that failed
its task; scoring it 0 would teach the policy that the infrastructure's failure was its own. So
after the agent exits, what the platform saw decides:

- the proxy restarted while the agent ran (its start time is after the agent's) -> `backend_error`;
- the agent's last LLM call failed on the platform's side (a 5xx: engine unreachable, proxy
  overloaded; a 404: the engine does not serve the model the job named) -> `backend_error`;
- the engine refused the agent's last LLM call (400/413/422: the prompt over the model's
  context, `max_tokens` past it, a parameter it rejects) -> `backend_error` with the engine's
  message: no token of the policy was sampled, so a 0 would score the platform's limit, not the
  policy. The proxy's own refusals (bad token, spent budget, sampling policy) never reach the
  call log, so a logged 4xx is the engine's. Not restarted: the same transcript meets the same
  limit again, so the rollout ends unscored at once instead of burning its attempts;
- the agent failed with no LLM call stored, or with its last call answered 502/503/504, and the
  engine does not answer (`engine_down`, asked only then) -> `backend_error`, restarted, naming
  the engine's URL: the engine is down, and neither the harness nor the proxy is to blame;
- no LLM call of the agent reached the proxy at all -> `runtime_error` (the harness failed before
  the policy acted: misconfigured, missing, crashed at start);
- the attempt spent the job's `max_tokens_per_rollout` (the proxy refused its further calls) ->
  `token_budget`, an agent outcome like `max_turns` (checked first: a spent budget is why the
  agent stopped, whatever it did next);
- otherwise the agent's own outcome: `completed`, `timeout`, or `agent_error`.

A clean exit (0) is always `completed`: the agent got through whatever happened (an engine refusal
it recovered from included). The infrastructure outcomes are never scored; the transient ones
(`restart`) start the rollout over (a new attempt, within `retries.max_attempts`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from polar_mq.calls import AttemptCalls, CallSummary, last_agent_answer, summarize
from polar_mq.jobs.verdicts import MODEL_NOT_SERVED
from polar_mq.models import TerminationReason
from polar_mq.runtimes import ExecResult

PLATFORM_STATUSES = frozenset({404, 500, 502, 503, 504})
"""Failed-call statuses that are the platform's: the engine or the proxy could not serve."""
UNANSWERED_STATUSES = frozenset({502, 503, 504})
"""The proxy's answers when no engine answered it: asked whether the engine is down."""
ENGINE_REFUSALS = frozenset({400, 413, 422})
"""Logged-call statuses of a request the engine refused (only upstream answers are logged)."""
ENGINE_MESSAGE_MAX = 500
"""Characters of the engine's message kept in the outcome's `why`."""


@dataclass(frozen=True, slots=True)
class AgentOutcome:
    reason: str
    why: str | None = None
    """For an infrastructure outcome: what the platform saw."""
    restart: bool = False
    """A transient infrastructure failure: start the rollout over (a new attempt)."""

    @property
    def infrastructure(self) -> bool:
        return self.reason in TerminationReason.INFRASTRUCTURE


def summarize_calls(
    engine: Engine,
    rollout_id: uuid.UUID,
    attempt: int,
    created_at: datetime | None = None,
) -> CallSummary:
    """How many agent calls the attempt made and the status of its last one (one query, on a
    bare connection: no session for one read), with its answer when the engine refused it."""
    which = AttemptCalls(rollout_id, attempt, created_at)
    with engine.connect() as conn:
        summary = summarize(conn, which)
        if summary.last_status in ENGINE_REFUSALS:  # the refusal's reason: a second, rare read
            answer = last_agent_answer(conn, which)
            return CallSummary(
                summary.calls, summary.last_status, summary.completion_tokens, answer
            )
    return summary


def engine_message(answer: dict[str, Any] | None) -> str:
    """The engine's reason in a logged error answer: OpenAI's `{"error": {"message"}}`, vLLM's
    older `{"message"}`, or the raw body the proxy kept when it was not JSON."""
    if not answer:
        return "no message"
    error = answer.get("error")
    message: Any = error.get("message") if isinstance(error, dict) else error
    for key in ("message", "detail", "raw"):
        if message:
            break
        message = answer.get(key)
    text = str(message) if message else str(answer)
    if len(text) > ENGINE_MESSAGE_MAX:
        text = text[:ENGINE_MESSAGE_MAX] + "..."
    return text


def classify(
    result: ExecResult,
    calls: CallSummary,
    agent_started: datetime,
    proxy_started_at: float | None,
    token_budget: int | None = None,
    engine_down: Callable[[], str | None] | None = None,
) -> AgentOutcome:
    """The termination reason of an agent run (see the module docstring); `engine_down` says why
    the engine does not answer (None: it does), asked only for a failed run without stored calls
    or whose last call got no answer from the engine (502, 503, 504)."""
    if token_budget is not None and calls.completion_tokens >= token_budget:
        # The proxy refused its calls from here on: the policy's own truncation, like max_turns.
        return AgentOutcome(TerminationReason.TOKEN_BUDGET)
    if result.ok:
        return AgentOutcome(TerminationReason.COMPLETED)
    if proxy_started_at is not None and proxy_started_at > agent_started.timestamp():
        return AgentOutcome(
            TerminationReason.BACKEND_ERROR,
            "the proxy restarted while the agent ran (calls it made then were refused)",
            restart=True,
        )
    if calls.last_status == 404:
        return AgentOutcome(TerminationReason.BACKEND_ERROR, MODEL_NOT_SERVED, restart=True)
    if calls.calls == 0 or calls.last_status in UNANSWERED_STATUSES:
        down = engine_down() if engine_down is not None else None
        if down is not None:  # the engine, not the harness nor the proxy
            return AgentOutcome(TerminationReason.BACKEND_ERROR, down, restart=True)
    if calls.last_status in PLATFORM_STATUSES:
        return AgentOutcome(
            TerminationReason.BACKEND_ERROR,
            f"the agent's last LLM call failed on the platform's side (HTTP {calls.last_status})",
            restart=True,
        )
    if calls.last_status in ENGINE_REFUSALS:
        return AgentOutcome(
            TerminationReason.BACKEND_ERROR,
            f"the engine refused the agent's last call (HTTP {calls.last_status}): "
            f"{engine_message(calls.last_response)}",
        )
    if calls.calls == 0:
        return AgentOutcome(
            TerminationReason.RUNTIME_ERROR,
            "the harness ended before any LLM call reached the proxy",
        )
    if result.timed_out or result.inactive:
        return AgentOutcome(TerminationReason.TIMEOUT)
    return AgentOutcome(TerminationReason.AGENT_ERROR)
