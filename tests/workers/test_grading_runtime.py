"""The separate evaluation runtime on the real `local` runtime: prewarm, copy-in, hidden files.

The pipeline-level behaviour (prewarm overlapping the agent, events, no leftovers) is in
tests/e2e/test_grading_runtime_e2e.py.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.lifecycle.transitions import RolloutRef
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.options import runtime_from_spec
from polar_mq.spec import PrepareRecipe, RuntimeSpec
from polar_mq.workers.janitor import NodeJanitor
from polar_mq.workers.stages.common import StageFailure, runtime_id_for
from polar_mq.workers.stages.grading_runtime import (
    grading_recipe,
    grading_runtime,
    open_grading_runtime,
    release_grading_runtime,
    start_prewarm,
)
from tests.runtimes.runtime_backends import KINDS, TEST_IMAGE, skip_reason

HIDDEN = "#!/bin/sh\ngrep -q 42 answer.txt\n"
GRADER = {"files": {"hidden_test.sh": HIDDEN}, "commands": ["echo ready > grader_ready"]}


def _rollout(attempt: int = 1) -> RolloutRef:
    return RolloutRef(uuid.uuid4(), uuid.uuid4(), 1, 0, 0, attempt, None, None, None, None)


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(runtime_root=tmp_path / "runtimes")


def _agent_runtime(settings: Settings, rollout: RolloutRef, kind: str = "local") -> Runtime:
    sandbox = _spec(_sandbox(kind))
    runtime = runtime_from_spec(sandbox, runtime_id_for(rollout), settings.runtime_root)
    runtime.start()
    return runtime


def _spec(data: dict[str, Any]) -> RuntimeSpec:
    """The typed runtime spec the stages hand over (as loaded from the stored job)."""
    return RuntimeSpec.model_validate(data)


def _sandbox(kind: str) -> dict[str, Any]:
    return {"kind": kind, "image": TEST_IMAGE} if kind == "docker" else {"kind": kind}


def test_recipe_present_only_when_asked() -> None:
    assert grading_recipe(RuntimeSpec()) is None
    assert grading_recipe(_spec({"evaluation": None})) is None
    assert grading_recipe(_spec({"evaluation": {}})) == PrepareRecipe()  # separate, no recipe
    assert grading_recipe(_spec({"evaluation": {"prepare": GRADER}})) == PrepareRecipe(**GRADER)


def test_without_evaluation_runtime_the_agents_own_is_used(settings: Settings) -> None:
    rollout = _rollout()
    agent = _agent_runtime(settings, rollout)
    try:
        runtime, detail = grading_runtime(settings, RuntimeSpec(), rollout, agent, 10)
        assert runtime is agent and detail == {}
        assert start_prewarm(settings, RuntimeSpec(), rollout, 10) is None
    finally:
        agent.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_prewarmed_grader_gets_the_workspace_but_not_the_agents_processes(
    settings: Settings, kind: str
) -> None:
    if (reason := skip_reason(kind)) is not None:
        pytest.skip(reason)
    rollout = _rollout()
    spec = _spec({**_sandbox(kind), "evaluation": {"prepare": GRADER}})
    agent = _agent_runtime(settings, rollout, kind)
    prewarm = start_prewarm(settings, spec, rollout, 10)
    assert prewarm is not None
    try:
        # The agent answers, tries to plant its own "test", leaves a daemon and a FIFO behind.
        agent.upload(b"42\n", "answer.txt")
        agent.upload(b"#!/bin/sh\nexit 0\n", "hidden_test.sh")
        (agent.workdir / "sub").mkdir()
        agent.upload(b"nested", "sub/file.txt")
        os.mkfifo(agent.workdir / "pipe")
        agent.exec("sleep 300 > /dev/null 2>&1 &", timeout=5)
        daemons = set(agent.alive_processes())  # bwrap ends them with their command
        recorded = prewarm.join()
        assert recorded["eval_prewarm_s"] is not None and "eval_prewarm_error" not in recorded

        grader, detail = grading_runtime(settings, spec, rollout, agent, 10)
        assert grader.runtime_id == f"{runtime_id_for(rollout)}-eval"
        assert detail["eval_runtime_prewarmed"] is True
        assert grader.download("answer.txt") == b"42\n"
        assert grader.download("sub/file.txt") == b"nested"
        assert grader.download("grader_ready") == b"ready\n"  # the recipe's command ran
        assert grader.download("hidden_test.sh").decode() == HIDDEN  # the grader's file wins
        assert not (grader.workdir / "pipe").exists()
        assert daemons.isdisjoint(grader.alive_processes())
        assert grader.exec("sh hidden_test.sh", timeout=10).ok
    finally:
        agent.stop()
        release_grading_runtime(settings, spec, rollout)
    assert not list(settings.runtime_root.iterdir())
    assert grader.alive_processes() == [] and agent.alive_processes() == []


def test_not_prewarmed_is_prepared_at_evaluate(settings: Settings) -> None:
    rollout = _rollout()
    spec = _spec({"kind": "local", "evaluation": {"prepare": GRADER}})
    agent = _agent_runtime(settings, rollout)
    try:
        grader, detail = grading_runtime(settings, spec, rollout, agent, 10)
        assert detail["eval_runtime_prewarmed"] is False
        assert grader.download("grader_ready") == b"ready\n"
    finally:
        agent.stop()
        release_grading_runtime(settings, spec, rollout)


def test_failing_recipe_fails_the_stage_and_leaves_nothing(settings: Settings) -> None:
    rollout = _rollout()
    spec = _spec({"kind": "local", "evaluation": {"prepare": {"commands": ["exit 3"]}}})
    prewarm = start_prewarm(settings, spec, rollout, 10)
    assert prewarm is not None
    assert "exit 3" in prewarm.join()["eval_prewarm_error"]
    grader = open_grading_runtime(settings, spec, rollout)
    assert not grader.path.exists()  # type: ignore[attr-defined]
    agent = _agent_runtime(settings, rollout)
    try:
        with pytest.raises(StageFailure) as failure:
            grading_runtime(settings, spec, rollout, agent, 10)
        assert failure.value.reason == "runtime_error"
        assert not grader.path.exists()  # type: ignore[attr-defined]
    finally:
        agent.stop()


def test_janitor_removes_a_grader_nobody_owns(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    """An evaluation runtime is judged like its rollout's attempt: unknown rollout, orphan."""
    rollout = _rollout()
    grader = open_grading_runtime(settings, _spec({"evaluation": {}}), rollout)
    grader.start()
    grader.exec("sleep 300 > /dev/null 2>&1 &", timeout=5)
    assert NodeJanitor(settings.runtime_root, db_session_factory).sweep_once() == [
        grader.runtime_id
    ]
    assert grader.alive_processes() == [] and not list(settings.runtime_root.iterdir())
