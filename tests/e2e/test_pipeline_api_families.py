"""Agents speaking Anthropic Messages, OpenAI Responses and Gemini through the whole pipeline.

Each rollout runs `family_agent.py` (the family's official SDK, a calculator tool loop) as a
command harness in a real worker, through the real proxy process, against the vLLM-shaped fake;
the build stage reads each call's engine request, so `prefix_merge` must make one sample of the
two calls, and `exact_match` grades the final answer the agent saw.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import LlmCall, Rollout, TrajectorySample
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of

pytestmark = pytest.mark.e2e

AGENT = Path(__file__).resolve().parent / "family_agent.py"
API_TYPES = {"anthropic": "anthropic_messages", "responses": "responses", "gemini": "gemini"}


@pytest.mark.parametrize("family", list(API_TYPES))
def test_family_agent_rollouts_complete_with_exact_tokens(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session], family: str
) -> None:
    client = client_of(fake_stack)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENT))} {family}"
    job = client.submit(
        [
            {"instruction": "What is 6*7?", "answer": "42"},
            {"instruction": "What is 9+1?", "answer": "11"},
        ],
        samples_per_task=2,
        harness={"type": "command", "command": command},
        builder="prefix_merge",
        evaluator="exact_match",
        timeouts={"agent_s": 60},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    if status["by_status"] != {"completed": 4}:
        detail = client.rollout(str(job.rollout_ids[0]))
        pytest.fail(f"{status['by_status']}: {detail}")
    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        for rollout in rollouts:
            assert rollout.termination_reason == "completed"
            assert rollout.reward == (1.0 if rollout.task_index == 0 else 0.0), rollout.error
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert [c.api_type for c in calls] == [API_TYPES[family]] * 2
            assert all(c.complete and c.status_code == 200 for c in calls)
            assert calls[1].engine_request is not None
            assert calls[1].engine_request["messages"][-1]["role"] == "tool"
            assert "messages" not in calls[1].request or family == "anthropic"
            (sample,) = session.scalars(
                select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
            ).all()
            first, second = calls
            assert first.prompt_ids and first.completion_ids and second.completion_ids
            assert sample.prompt_ids == first.prompt_ids
            assert (
                sample.prompt_ids + sample.response_ids == second.prompt_ids + second.completion_ids
            )
            trained = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
            assert trained == first.completion_ids + second.completion_ids
