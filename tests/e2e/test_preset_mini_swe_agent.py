"""mini-swe-agent, installed from PyPI and run unmodified through the real pipeline and proxy.

The scripted fake engine drives mini's own `bash` tool: it writes answer.txt, then submits with
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt`. The submission is the answer the
rollout is graded on; the trajectory and the workspace diff (a git workspace) are stored.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    run_preset,
)

pytestmark = pytest.mark.e2e

GIT_INIT = (
    "git init -q && git -c user.name=polar -c user.email=polar@example.com "
    "commit -q --allow-empty -m init"
)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"


def test_mini_swe_agent_runs_a_bash_tool_and_submits(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("mini_swe_agent")
    tag = preset_stack.plan(
        "mini_swe_agent",
        {
            "turns": [
                {"tool": "bash", "arguments": {"command": "echo $((6*7)) > answer.txt"}},
                {"tool": "bash", "arguments": {"command": SUBMIT}},
            ],
            "after": "The answer is 41.",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "mini_swe_agent", "options": {"max_turns": 5}},
        [{"instruction": f"{tag} What is 6*7? Write it to answer.txt.", "answer": "42"}],
        evaluator="exact_match",
        runtime={"prepare": {"commands": [GIT_INIT]}},
        timeouts={"agent_s": 120},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    assert len(calls) == 2, explain(run)  # one call per step, no side calls
    assert all(c.purpose == "agent" for c in calls)
    assert calls[0].request is not None
    assert [t["function"]["name"] for t in calls[0].request["tools"]] == ["bash"]
    # the tool really ran: its result (return code 0) is in the next call's conversation
    tool_results = [m for m in calls[1].request["messages"] if m.get("role") == "tool"]
    assert tool_results and '"returncode": 0' in tool_results[0]["content"]
    assert rollout.reward == 1.0, explain(run)  # graded on the submission "42"

    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "trajectory", "workspace.diff"} <= set(artifacts), explain(run)
    trajectory = json.loads(artifacts["trajectory"])
    assert trajectory["info"]["exit_status"] == "Submitted"
    assert trajectory["info"]["submission"].strip() == "42"
    diff = artifacts["workspace.diff"].decode()
    assert "answer.txt" in diff and "+42" in diff and ".polar" not in diff
