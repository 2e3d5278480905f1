"""TITO through the whole pipeline: real proxy process, workers, PostgreSQL, agent subprocess.

The proxy runs with `proxy_tito=on` in front of the vLLM-shaped fake. The reference tool agent
(OpenAI SDK, chat) and the Anthropic SDK agent each run a calculator tool loop; the second call
of each rollout goes token-in, is stored with `prompt_source = tito` (migration 0011, the real
writer), and the build stage's `prefix_merge` proves the chain: one sample, `tito_proven` 1.
"""

from __future__ import annotations

import shlex
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import Event, LlmCall, Rollout, TrajectorySample
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAMILY_AGENT = Path(__file__).resolve().parents[2] / "e2e" / "family_agent.py"
PYTHON = shlex.quote(sys.executable)
AGENTS = {
    "chat": f"{PYTHON} -m polar_mq.agents.tool_agent",
    "anthropic_messages": f"{PYTHON} {shlex.quote(str(FAMILY_AGENT))} anthropic",
}


@pytest.fixture(scope="module")
def tito_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with fake_upstream_stack(pg_url, tmp_path_factory.mktemp("tito"), proxy_tito="on") as stack:
        yield stack


@pytest.mark.parametrize("api_type", list(AGENTS))
def test_rollouts_go_token_in_and_build_one_proven_sample(
    tito_stack: LocalStack, db_session_factory: sessionmaker[Session], api_type: str
) -> None:
    client = client_of(tito_stack)
    job = client.submit(
        [{"instruction": "What is 6*7?", "answer": "42"}],
        samples_per_task=2,
        harness={"type": "command", "command": AGENTS[api_type]},
        builder="prefix_merge",
        evaluator="exact_match",
        timeouts={"agent_s": 60},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    assert status["by_status"] == {"completed": 2}, client.rollout(str(job.rollout_ids[0]))
    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        for rollout in rollouts:
            assert rollout.reward == 1.0, rollout.error
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert [(c.api_type, c.prompt_source, c.tito_fallback) for c in calls] == [
                (api_type, "chat", "first_call"),
                (api_type, "tito", None),
            ]
            first, second = calls
            context = [*(first.prompt_ids or []), *(first.completion_ids or [])]
            assert (second.prompt_ids or [])[: len(context)] == context
            (sample,) = session.scalars(
                select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
            ).all()
            assert sample.meta["prompt_sources"] == ["chat", "tito"]
            stats: dict[str, Any] = session.scalars(
                select(Event.detail).where(
                    Event.rollout_id == rollout.id, Event.stage == "build", Event.kind == "finished"
                )
            ).one()
            assert (stats["samples"], stats["tito_proven"], stats["tito_unproven"]) == (1, 1, 0)


def test_a_job_with_tito_off_goes_the_chat_way_on_a_tito_proxy(
    tito_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    """`tito: off` travels from the submitted spec through the run-agent stage's token to the
    proxy: every call goes the chat way (no fallback recorded: TITO is off, not failing)."""
    client = client_of(tito_stack)
    job = client.submit(
        [{"instruction": "What is 6*7?", "answer": "42"}],
        harness={"type": "command", "command": AGENTS["chat"]},
        builder="prefix_merge",
        evaluator="exact_match",
        timeouts={"agent_s": 60},
        tito="off",
    )
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    assert status["by_status"] == {"completed": 1}, client.rollout(str(job.rollout_ids[0]))
    with db_session_factory() as session:
        calls = session.scalars(
            select(LlmCall)
            .where(LlmCall.rollout_id == uuid.UUID(job.rollout_ids[0]))
            .order_by(LlmCall.seq)
        ).all()
        assert [(c.prompt_source, c.tito_fallback) for c in calls] == [("chat", None)] * 2
