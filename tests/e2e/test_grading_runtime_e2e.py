"""Grading in a separate runtime, end to end: real API, workers, proxy, fake vLLM, reference agent.

The job hides its test from the agent (it exists only in the evaluation runtime's recipe), the
agent leaves a daemon behind, and the grader's recipe is timed against the agent's run to show it
started while the agent ran (the start, not the end: on a loaded CI machine the prewarm may begin
late in the agent's 3 s, and a recipe finishing after the agent is still a prewarm; nor the
agent's first command, which the prewarm launched with it may precede by a few milliseconds).
Rewards must follow the hidden test, and nothing may be left.
"""

from __future__ import annotations

import shlex
import sys
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.harnesses import REFERENCE_AGENT_MODULE
from polar_mq.models import Evaluation, Event, EventKind, Rollout
from polar_mq.runtimes import LocalRuntime
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of

# The agent notes what it could see and when it ran, leaves a daemon, then runs the reference
# agent (which writes its answer to answer.txt after its calls through the proxy).
AGENT = (
    "date +%s.%N > agent_start; ls -a > seen.txt; (sleep 300 > /dev/null 2>&1 &); sleep 3; "
    f"{shlex.quote(sys.executable)} -m {REFERENCE_AGENT_MODULE}; rc=$?; "
    "date +%s.%N > agent_end; exit $rc"
)
# Passes when the agent wrote its answer file and never saw the test; the recipe stamps when it ran.
# The stage launches the prewarm and the agent together, so either may run its first command first
# (CI saw the grader's 4 ms ahead): started no more than 1 s before the agent and before its end.
HIDDEN_TEST = "test -f answer.txt && ! grep -q hidden_test seen.txt\n"
GRADER = {
    "files": {"hidden_test.sh": HIDDEN_TEST},
    "commands": ["date +%s.%N > grader_started_at; sleep 1.5"],  # the agent sleeps 3 s first
}
STAMPS = (
    "awk -v a=$(cat agent_start) -v g=$(cat grader_started_at) -v e=$(cat agent_end) "
    "'BEGIN { exit !(a - 1 <= g && g <= e) }' || { echo \"grader started $(cat grader_started_at), "
    'agent ran $(cat agent_start) to $(cat agent_end)" >&2; exit 1; }'
)


def _finished(session: Session, rollout_id: Any, stage: str) -> dict[str, Any]:
    (event,) = session.scalars(
        select(Event).where(
            Event.rollout_id == rollout_id, Event.stage == stage, Event.kind == EventKind.FINISHED
        )
    ).all()
    return dict(event.detail)


def test_hidden_test_in_a_prewarmed_grading_runtime(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    client = client_of(fake_stack)
    job = client.submit(
        [{"instruction": "What is 6*7?"}, {"instruction": "What is 2+2?"}],
        samples_per_task=2,
        harness={"type": "command", "command": AGENT},
        runtime={"evaluation": {"prepare": GRADER}},
        evaluator={"name": "command", "command": f"sh hidden_test.sh && {STAMPS}"},
        timeouts={"agent_s": 60},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    assert status["by_status"] == {"completed": 4}, status
    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        for rollout in rollouts:
            evaluation = session.scalars(
                select(Evaluation).where(Evaluation.rollout_id == rollout.id)
            ).one()
            assert rollout.reward == 1.0, evaluation.detail
            agent = _finished(session, rollout.id, "run_agent")
            assert agent["eval_prewarm_s"] is not None and "eval_prewarm_error" not in agent
            grading = _finished(session, rollout.id, "evaluate")
            assert grading["eval_runtime_prewarmed"] is True
            assert grading["eval_runtime_id"] == f"{rollout.id.hex}-{rollout.attempt}-eval"
    root = fake_stack.settings.runtime_root
    runtime_ids = {f"{r.id.hex}-{r.attempt}{suffix}" for r in rollouts for suffix in ("", "-eval")}
    # The runner stops the runtimes just after the result is committed (the rollout is visible
    # as completed a moment before): removed within a bound, not at the instant of the status.
    deadline = time.monotonic() + 15
    while [rid for rid in runtime_ids if (root / rid).exists()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [rid for rid in runtime_ids if (root / rid).exists()], "both runtimes removed"
    assert not [rid for rid in runtime_ids if LocalRuntime(rid, root).alive_processes()]
