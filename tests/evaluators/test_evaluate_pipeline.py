"""Evaluators end to end: real API, Celery worker, proxy and fake-vLLM processes on PostgreSQL.

A `gate` job (exact answer first, then a judge through the proxy) and a job whose evaluator raises:
both end with every rollout completed, the reward or its absence stored with the reason, the judge
calls logged as 'judge' and absent from the trajectories.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import PolarMQError
from polar_mq.models import Evaluation, LlmCall, Rollout, TrajectorySample
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack

pytestmark = pytest.mark.e2e

TASKS = [
    {"instruction": "What is 6*7?", "answer": "42", "grade": 7},
    {"instruction": "What is 100-1?", "answer": "98", "grade": 9},  # wrong: the gate stays shut
]
UNGRADED = {"instruction": "Compute 12+30.", "answer": "42"}
"""No "grade": the judge could not be asked. Such a task used to run, every rollout of it ending
unscored; it is refused at submit now (`test_a_task_the_judge_cannot_read_is_refused...`)."""
# The fake policy answers a user turn "RESULT: x" with "ANSWER: x": the judge "says" the score.
GATED_JUDGE = {
    "name": "gate",
    "gate": "exact_match",
    "then": {"name": "llm_judge", "prompt": "RESULT: Score: {grade}/10 for {answer!r}"},
}


@pytest.fixture(scope="module")
def stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with fake_upstream_stack(pg_url, tmp_path_factory.mktemp("e2e-evaluators")) as local:
        yield local


def run_job(stack: LocalStack, tasks: list[dict[str, Any]], evaluator: Any) -> str:
    client = client_of(stack)
    job = client.submit(tasks, samples_per_task=2, evaluator=evaluator, timeouts={"agent_s": 60})
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    assert status["by_status"] == {"completed": 2 * len(tasks)}, status
    return str(job.job_id)


def test_gated_judge_rewards_and_judge_calls(
    stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = run_job(stack, TASKS, GATED_JUDGE)
    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job_id)).all()
        assert len(rollouts) == 4
        for rollout in rollouts:
            (evaluation,) = session.scalars(
                select(Evaluation).where(Evaluation.rollout_id == rollout.id)
            ).all()
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            samples = session.scalars(
                select(TrajectorySample)
                .where(TrajectorySample.rollout_id == rollout.id)
                .order_by(TrajectorySample.sample_index)
            ).all()
            agent_calls = [c for c in calls if c.purpose == "agent"]
            judge_calls = [c for c in calls if c.purpose == "judge"]
            detail = evaluation.detail
            assert evaluation.evaluator == "gate"
            assert len(agent_calls) >= 2
            # per_call: one sample per agent call, and nothing of the judge's
            assert [(s.prompt_ids, s.response_ids) for s in samples] == [
                (c.prompt_ids, c.completion_ids) for c in agent_calls
            ]
            if rollout.task_index == 0:
                assert rollout.reward == evaluation.reward == pytest.approx(0.7)
                assert detail["passed"] is True
                # the reference agent writes its answer file: the judge saw the answer "42"
                assert detail["then"]["detail"]["reply"] == "ANSWER: Score: 7/10 for '42'"
                assert len(judge_calls) == 1
                assert judge_calls[0].seq > max(c.seq for c in agent_calls)
            else:
                assert rollout.reward == evaluation.reward == 0.0
                assert detail["passed"] is False
                assert judge_calls == []  # a shut gate costs no judge call


def test_a_task_the_judge_cannot_read_is_refused_at_submission(stack: LocalStack) -> None:
    with pytest.raises(PolarMQError) as excinfo:
        client_of(stack).submit([*TASKS, UNGRADED], samples_per_task=1, evaluator=GATED_JUDGE)
    assert excinfo.value.status == 422
    assert "evaluator 'gate' reads each task's 'grade', which tasks[2] (1 of 3 tasks) lack" in str(
        excinfo.value
    )


def test_an_evaluator_error_is_recorded_with_its_reason(
    stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    # json.loads(ctx) raises TypeError: a stdlib stand-in for a buggy user scoring function
    job_id = run_job(stack, TASKS[:1], {"name": "python", "callable": "json:loads"})
    with db_session_factory() as session:
        rows = session.execute(
            select(Rollout.status, Rollout.reward, Evaluation.reward, Evaluation.detail)
            .join(Evaluation, Evaluation.rollout_id == Rollout.id)
            .where(Rollout.job_id == job_id)
        ).all()
    assert len(rows) == 2
    for status, reward, evaluation_reward, detail in rows:
        assert (status, reward, evaluation_reward) == ("completed", None, None)
        assert detail["error"] == "TypeError"
        assert "EvalContext" in detail["message"]


@pytest.mark.parametrize(
    ("evaluator", "message"),
    [
        ({"name": "weighted", "evaluators": []}, "'evaluators' must be a non-empty list"),
        ({"name": "gate", "gate": "completed", "then": {"name": "llm_judge"}}, "'prompt'"),
        ({"name": "llm_judge", "prompt": "{answer.__class__}"}, "must be a plain name"),
    ],
)
def test_bad_specs_are_refused_at_submission(
    stack: LocalStack, evaluator: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolarMQError) as excinfo:
        client_of(stack).submit(TASKS[:1], samples_per_task=1, evaluator=evaluator)
    assert 400 <= excinfo.value.status < 500
    assert message in str(excinfo.value)
