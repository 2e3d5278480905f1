"""The run-agent stage's verdict from the platform's side (`rollouts.agent_outcome.classify`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from polar_mq.rollouts.agent_outcome import CallSummary, classify
from polar_mq.runtimes import ExecResult

STARTED = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
BEFORE = (STARTED - timedelta(hours=1)).timestamp()
AFTER = (STARTED + timedelta(seconds=5)).timestamp()


def result(exit_code: int | None, timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code, "", "", timed_out, False, 1.0)


@pytest.mark.parametrize(
    ("run", "calls", "proxy_started", "reason"),
    [
        (result(0), CallSummary(3, 200), BEFORE, "completed"),
        (result(0), CallSummary(0, None), AFTER, "completed"),  # it got through anyway
        (result(1), CallSummary(3, 200), BEFORE, "agent_error"),
        (result(1), CallSummary(3, 400), BEFORE, "backend_error"),  # e.g. its prompt too long
        (result(1), CallSummary(3, 413), BEFORE, "backend_error"),  # the engine refused
        (result(1), CallSummary(3, 422), BEFORE, "backend_error"),  # the engine refused
        (result(0), CallSummary(3, 400), BEFORE, "completed"),  # it recovered and finished
        (result(1), CallSummary(3, 401), BEFORE, "agent_error"),  # not an engine refusal
        (result(None, timed_out=True), CallSummary(2, 200), BEFORE, "timeout"),
        (result(1), CallSummary(1, 200), AFTER, "backend_error"),  # the proxy restarted
        (result(1), CallSummary(4, 502), BEFORE, "backend_error"),  # engine unreachable
        (result(1), CallSummary(1, 404), None, "backend_error"),  # model not served
        (result(None, timed_out=True), CallSummary(2, 503), BEFORE, "backend_error"),
        (result(3), CallSummary(0, None), BEFORE, "runtime_error"),  # never reached the model
        (result(None, timed_out=True), CallSummary(0, None), None, "runtime_error"),
    ],
)
def test_classify(
    run: ExecResult, calls: CallSummary, proxy_started: float | None, reason: str
) -> None:
    outcome = classify(run, calls, STARTED, proxy_started)
    assert outcome.reason == reason
    assert outcome.infrastructure == (reason in ("backend_error", "runtime_error"))
    assert (outcome.why is not None) == outcome.infrastructure


def test_engine_refusal_ends_the_rollout_with_the_engines_message_and_no_restart() -> None:
    refusal = {"error": {"message": "This model's maximum context length is 256 tokens"}}
    calls = CallSummary(2, 400, last_response=refusal)
    outcome = classify(result(1), calls, STARTED, BEFORE)
    assert outcome.reason == "backend_error" and outcome.infrastructure
    assert not outcome.restart, "a deterministic refusal would recur: no new attempt"
    assert outcome.why == (
        "the engine refused the agent's last call (HTTP 400): "
        "This model's maximum context length is 256 tokens"
    )
    unreachable = classify(result(1), CallSummary(2, 502), STARTED, BEFORE)
    assert unreachable.restart, "a transient platform failure still starts the rollout over"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"object": "error", "message": "bad `top_k`"}, "bad `top_k`"),
        ({"raw": "<html>413 Request Entity Too Large</html>"}, "<html>413 Request"),
        (None, "no message"),
        ({"error": {"message": "x" * 2000}}, "x" * 500 + "..."),
    ],
)
def test_engine_message_reads_every_error_shape(
    answer: dict[str, object] | None, message: str
) -> None:
    why = classify(result(1), CallSummary(1, 400, last_response=answer), STARTED, None).why
    assert why is not None and why.split("(HTTP 400): ", 1)[1].startswith(message)


@pytest.mark.parametrize(
    ("run", "calls", "budget", "reason"),
    [
        (result(1), CallSummary(5, 200, completion_tokens=40), 40, "token_budget"),  # refused
        (result(0), CallSummary(5, 200, completion_tokens=41), 40, "token_budget"),  # gave up
        (result(1), CallSummary(5, 200, completion_tokens=39), 40, "agent_error"),  # not spent
        (result(0), CallSummary(5, 200, completion_tokens=39), 40, "completed"),
        (result(1), CallSummary(5, 200, completion_tokens=10**6), None, "agent_error"),
    ],
)
def test_spent_token_budget_is_the_agents_outcome(
    run: ExecResult, calls: CallSummary, budget: int | None, reason: str
) -> None:
    outcome = classify(run, calls, STARTED, BEFORE, budget)
    assert outcome.reason == reason
    assert not outcome.infrastructure  # scored, like max_turns
