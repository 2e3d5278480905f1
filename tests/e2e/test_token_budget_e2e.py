"""A rollout's token budget, end to end: real proxy, fake engine, workers, a real agent process.

The agent (budget_agent.py) keeps calling and asks for 1,000 tokens each time; the job allows 40
completion tokens per rollout. The proxy must clamp the calls so that together they generate
exactly 40, refuse the next one with 400 `token_budget_exhausted` (which the agent sees, in its
API family's shape: OpenAI chat for one task, Anthropic Messages for the other), and the rollout
must end `token_budget`, scored, with every call it made logged.
"""

from __future__ import annotations

import shlex
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from stack import client_of

from polar_mq.models import LlmCall, Rollout, RolloutArtifact
from polar_mq.stack.devstack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENT = Path(__file__).resolve().parent / "budget_agent.py"
BUDGET = 40


def test_agent_that_keeps_calling_is_stopped_at_its_budget(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    client = client_of(fake_stack)
    submitted = client.submit(
        [
            {"instruction": "Tell me a very long story."},
            {"instruction": "[anthropic] Tell me a very long story."},
        ],
        samples_per_task=1,
        harness={"type": "command", "command": f"{shlex.quote(sys.executable)} {AGENT}"},
        evaluator="completed",
        max_tokens_per_rollout=BUDGET,
        timeouts={"agent_s": 120},
    )
    status = client.wait(str(submitted.job_id), progress=False, timeout=180)
    assert status["by_termination_reason"] == {"token_budget": 2}, status

    for rollout_id in submitted.rollout_ids:
        rid = uuid.UUID(str(rollout_id))
        with db_session_factory() as session:
            rollout = session.get_one(Rollout, rid)
            calls = list(
                session.scalars(select(LlmCall).where(LlmCall.rollout_id == rid).order_by("seq"))
            )
            log = session.scalar(
                select(RolloutArtifact.content).where(
                    RolloutArtifact.rollout_id == rid, RolloutArtifact.name == "agent.log"
                )
            )
        assert rollout.status == "completed" and rollout.reward is not None  # scored, usable
        assert len(calls) >= 2, "the budget should take more than one call to spend"
        assert all(c.status_code == 200 for c in calls)
        spent = [len(c.completion_ids or []) for c in calls]
        assert sum(spent) == BUDGET, spent
        # each call was clamped to what was left of the budget when it started
        left = BUDGET
        for call, tokens in zip(calls, spent, strict=True):
            assert call.engine_request is not None
            asked = call.engine_request.get(
                "max_tokens", call.engine_request.get("max_completion_tokens")
            )
            assert asked == left, (call.engine_request, left)
            left -= tokens
        assert rollout.n_llm_calls == len(calls)
        assert log is not None
        text = bytes(log).decode()
        assert f"refused after {len(calls)} calls: HTTP 400" in text, text[-2000:]
        if calls[0].api_type == "chat":
            assert "token_budget_exhausted" in text, text[-2000:]
        else:  # Anthropic's error shape: {"type": "error", "error": {"type", "message"}}
            assert calls[0].api_type == "anthropic_messages"
            assert "'type': 'error'" in text and "token budget" in text, text[-2000:]
