"""The judge through the real proxy: logged in PostgreSQL as purpose 'judge', never trained on.

The proxy app runs on a real socket (uvicorn in a thread) with its database writer on the session's
PostgreSQL and the vLLM-shaped fake as its upstream. The evaluate and build stage functions run
against it exactly as a worker calls them (without the claim/commit runner around them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, RolloutRef
from polar_mq.models import LlmCall, Rollout, RolloutStatus
from polar_mq.proxy import create_proxy_app
from polar_mq.spec import TaskInstance, load_spec
from polar_mq.testing.fake_vllm import create_fake_vllm_app
from polar_mq.testing.servers import serve_in_thread
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages import build, evaluate

SECRET = "judge-test-secret"
TASK = {"instruction": "What is 6*7?", "answer": "42", "grade": 7}
# The fake policy answers a user turn "RESULT: x" with "ANSWER: x": the judge "says" the score.
JUDGE_PROMPT = "RESULT: Score: {grade}/10 for {answer!r} (question: {instruction})"
EVALUATOR = {
    "name": "weighted",
    "evaluators": [
        {"spec": "exact_match", "weight": 0.5},
        {"spec": {"name": "llm_judge", "prompt": JUDGE_PROMPT, "system": "Grade."}, "weight": 0.5},
    ],
}


@pytest.fixture
def settings(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> Iterator[Settings]:
    """Worker settings pointing at a running proxy; asking for `db_session_factory` here makes
    the tables be emptied only after the proxy has stopped and written its last row."""
    base = Settings(
        database_url=pg_url,
        secret_key=SECRET,
        served_model="fake-model",
        upstream_url="http://upstream.test",
        runtime_root=tmp_path / "runtimes",
        proxy_spill_dir=tmp_path / "spill",
    )
    app = create_proxy_app(base, upstream_transport=httpx.ASGITransport(create_fake_vllm_app()))
    with serve_in_thread(app) as url:
        yield base.model_copy(update={"proxy_public_url": url})


def claimed_for(rollout_id: uuid.UUID, stage: Stage, spec: dict[str, Any]) -> Claimed:
    ref = RolloutRef(
        id=rollout_id, job_id=uuid.uuid4(), task_id=1, task_index=0, sample_index=0, attempt=1,
        node="n", runtime_id=None, agent_exit_code=0, termination_reason="completed",
    )  # fmt: skip
    return Claimed(ref, load_spec(spec), TaskInstance.of(TASK), "test-owner", stage)


def evaluating_rollout(factory: sessionmaker[Session]) -> uuid.UUID:
    """A real rollout in its evaluate stage: the proxy serves only rollouts that have not ended."""
    with unit_of_work(factory) as session:
        job = create_job(session, JobCreate.model_validate({"tasks": [TASK]}), "p")
        rollout_id = job.rollout_ids[0]
        status = {"status": RolloutStatus.EVALUATING}
        session.execute(update(Rollout).where(Rollout.id == rollout_id).values(**status))
    return rollout_id


def flush(settings: Settings) -> None:
    response = httpx.post(f"{settings.proxy_base_url}/admin/flush", timeout=30)
    assert response.status_code == 200, response.text


def test_judge_calls_are_logged_as_judge_and_kept_out_of_training(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    rollout_id = evaluating_rollout(db_session_factory)
    agent_token = issue_rollout_token(SECRET, rollout_id, 600)
    agent_call = httpx.post(
        f"{settings.proxy_base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {agent_token}"},
        json={"model": "fake-model", "messages": [{"role": "user", "content": "RESULT: 42"}]},
        timeout=30,
    )
    assert agent_call.status_code == 200, agent_call.text
    assert agent_call.json()["choices"][0]["message"]["content"] == "ANSWER: 42"
    flush(settings)

    ctx = WorkerContext(settings, publisher=lambda messages: None)
    spec = {"evaluator": EVALUATOR, "builder": "per_call"}
    outcome = evaluate.run(ctx, claimed_for(rollout_id, Stage.EVALUATE, spec))
    flush(settings)

    # the evaluation: exact_match on the agent's answer, the judge's 7/10, each part recorded
    assert outcome.columns() == {"reward": pytest.approx(0.5 * 1.0 + 0.5 * 0.7)}
    (evaluations,) = outcome.rows().values()
    (evaluation,) = evaluations
    assert evaluation["evaluator"] == "weighted"
    exact, judged = evaluation["detail"]["parts"]
    assert (exact["name"], exact["reward"]) == ("exact_match", 1.0)
    assert judged["name"] == "llm_judge"
    assert judged["reward"] == pytest.approx(0.7)
    assert judged["detail"]["score"] == 7
    assert judged["detail"]["reply"] == (
        "ANSWER: Score: 7/10 for 'ANSWER: 42' (question: What is 6*7?)"
    )

    # both calls are stored for the rollout; the judge's marked, with the prompt it was sent
    with db_session_factory() as session:
        calls = session.scalars(
            select(LlmCall).where(LlmCall.rollout_id == rollout_id).order_by(LlmCall.seq)
        ).all()
    assert [(c.seq, c.purpose) for c in calls] == [(0, "agent"), (1, "judge")]
    agent_row, judge_row = calls
    assert judge_row.request["messages"] == [
        {"role": "system", "content": "Grade."},
        {"role": "user", "content": JUDGE_PROMPT.format_map({**TASK, "answer": "ANSWER: 42"})},
    ]
    assert judge_row.request["temperature"] == 0.0
    assert judge_row.completion_ids  # captured token by token like any call

    # the build stage trains on the agent's call only, even with the judge's call in the table
    built = build.run(ctx, claimed_for(rollout_id, Stage.BUILD, spec))
    assert built.columns() == {"n_llm_calls": 1}
    samples = built.sample_rows()
    assert [(s["prompt_ids"], s["response_ids"]) for s in samples] == [
        (agent_row.prompt_ids, agent_row.completion_ids)
    ]
    # and a re-evaluation (e.g. a later attempt) still reads the agent's answer, not the judge's
    again = evaluate.run(ctx, claimed_for(rollout_id, Stage.EVALUATE, spec))
    assert again.detail()["final_text"] == "ANSWER: 42"
    flush(settings)


def test_an_agent_token_cannot_log_judge_calls_and_a_judge_token_is_refused_elsewhere(
    settings: Settings,
) -> None:
    """The purpose is signed: editing it into an agent token breaks the signature."""
    rollout_id = uuid.uuid4()
    agent_token = issue_rollout_token(SECRET, rollout_id, 600)
    prefix, signature = agent_token.rsplit("_", 1)
    forged = f"{prefix}_judge_{signature}"
    other_secret = issue_rollout_token("another-secret", rollout_id, 600, purpose="judge")
    for token in (forged, other_secret):
        response = httpx.post(
            f"{settings.proxy_base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert response.status_code == 401, response.text
