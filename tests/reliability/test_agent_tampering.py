"""Agent tampering is the policy's failure; a grader's own failure is the platform's.

Scenario: real agents (`payload_agent.py`) replace what their grader reads or writes with a
symlink — the hidden tests' directory (to `/etc`, to their own home), the reward file and the
answer file (to `/etc/passwd`, to a file of their own holding a winning value) — next to honest
agents doing the same tasks. Before, a swapped file failed the evaluation (no reward, dropped
from the statistics, or `runtime_error`) or, for a link inside the sandbox, was read as the
agent's reward. Now every tampered rollout completes with reward 0, usable, the refused path in
its evaluation detail, while the honest ones score 1. A grading failure of the platform's own
making (hidden tests missing on the node) stays an infrastructure failure: unscored.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.evaluators.base import WORKSPACE_TAMPERED
from polar_mq.models import Evaluation, TerminationReason
from tests.reliability.support import RelStack, check_invariants, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]

AGENT = Path(__file__).with_name("payload_agent.py")
PASSING = "def test_hidden():\n    assert True\n"
HIDDEN = {"files": {"tests/test_hidden.py": PASSING}}


def submit(rel: RelStack, tasks: list[dict[str, Any]], evaluator: Any) -> tuple[str, list[str]]:
    harness = {
        "type": "command",
        "command": f"{sys.executable} {AGENT}",
        "env": {"REL_CALL_LOG": str(rel.call_log)},
    }
    tasks = [{"instruction": f"task {i}", "payload": "nul", **t} for i, t in enumerate(tasks)]
    job = rel.client.submit(tasks, evaluator=evaluator, harness=harness, timeouts={"agent_s": 60})
    return str(job.job_id), [str(r) for r in job.rollout_ids]


def evaluations(factory: sessionmaker[Session], ids: list[str]) -> dict[str, Evaluation]:
    with factory() as session:
        rows = session.scalars(
            select(Evaluation).where(Evaluation.rollout_id.in_([uuid.UUID(i) for i in ids]))
        ).all()
    return {str(e.rollout_id): e for e in rows}


def usable(rel: RelStack, job_id: str) -> dict[str, bool]:
    return {
        str(s["rollout_id"]): s["usable"]
        for group in rel.client.results(job_id)
        for s in group["samples"]
    }


def test_swapped_grader_files_score_zero_and_honest_work_scores_one(
    rel: RelStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    hidden_dir = tmp_path / "hidden"
    hidden_dir.mkdir()
    (hidden_dir / "test_hidden.py").write_text(PASSING)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "test_decoy.py").write_text(PASSING)
    tests_files = submit(
        rel,
        [{"tests": HIDDEN}, {"tests": HIDDEN, "links": {"tests": "/etc"}},
         {"tests": HIDDEN, "links": {"tests": "$HOME"}}],
        {"name": "tests", "diff": False},
    )  # fmt: skip
    tests_path = submit(
        rel,
        [{"tests": {"path": str(hidden_dir)}},
         {"tests": {"path": str(hidden_dir)}, "links": {"tests": str(decoy)}}],
        {"name": "tests", "diff": False},
    )  # fmt: skip
    # never a system file here: the grading command itself (`echo > reward.txt`, run as root when
    # the worker is root and the runtime root is private) writes through the agent's link
    elsewhere = tmp_path / "outside.txt"
    elsewhere.write_text("x")
    reward_file = submit(
        rel,
        [{}, {"write": {"$HOME/mine": "1.0"}, "links": {"reward.txt": "$HOME/mine"}},
         {"links": {"reward.txt": str(elsewhere)}}],
        {"name": "command", "command": "echo 1.0 > reward.txt", "reward_file": "reward.txt"},
    )  # fmt: skip
    answer = submit(
        rel,
        [{"answer": "42", "write": {"answer.txt": "ANSWER: 42"}},
         {"answer": "42", "write": {"$HOME/ans": "42"}, "links": {"answer.txt": "$HOME/ans"}},
         {"answer": "root", "links": {"answer.txt": "/etc/passwd"}}],
        {"name": "exact_match"},
    )  # fmt: skip
    jobs = [tests_files, tests_path, reward_file, answer]
    ids = [rid for _, rids in jobs for rid in rids]
    wait_terminal(db_session_factory, ids, 180)
    rollouts = check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
    verdicts = evaluations(db_session_factory, ids)
    for job_id, (honest, *tampered) in jobs:
        flags = usable(rel, job_id)
        assert rollouts[honest].reward == 1.0, verdicts[honest].detail
        assert flags[honest] is True
        for rid in tampered:
            rollout, detail = rollouts[rid], verdicts[rid].detail
            assert rollout.termination_reason == TerminationReason.COMPLETED, rollout.error
            assert rollout.reward == 0.0 and flags[rid] is True, (rid, detail)
            assert detail["error"] == WORKSPACE_TAMPERED, detail
            assert "is a symlink" in detail["message"], detail
    assert (decoy / "test_decoy.py").read_text() == PASSING  # nothing written through a link
    assert not list(decoy.glob("test_hidden.py"))


def test_a_graders_own_missing_file_is_an_infrastructure_failure(
    rel: RelStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    missing = {"path": str(tmp_path / "not-on-this-node")}
    job_id, ids = submit(rel, [{"tests": missing}], {"name": "tests", "diff": False})
    wait_terminal(db_session_factory, ids, 120)
    rollouts = check_invariants(rel, db_session_factory, ids, {ids[0]: "failed"})
    rollout = rollouts[ids[0]]
    assert rollout.termination_reason == TerminationReason.RUNTIME_ERROR
    assert rollout.reward is None and "is not a directory on this node" in (rollout.error or "")
    assert usable(rel, job_id) == {ids[0]: False}
