"""The `openai_agents` preset end to end: the real SDK (by its driver), the real proxy and
pipeline, the scripted fake engine; once with the SDK's default Responses model, once with chat
completions.

The plan makes the agent call its own `run_shell` tool (writing a file into the workspace, a git
repository, so the file shows in `workspace.diff`), then answer. The answer is the SDK's
`final_output` (the driver's answer file), graded by `exact_match`.
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


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_runs_a_tool_and_answers(
    api: str, preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("openai_agents")
    tag = preset_stack.plan(
        f"openai_agents_{api}",
        {
            "turns": [
                {"tool": "run_shell", "arguments": {"command": "echo forty-two > result.txt"}},
                {"text": "The file is written. ANSWER: 42"},
            ],
            "after": "ANSWER: 42",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "openai_agents", "options": {"api": api, "max_turns": 5}},
        [{"instruction": f"{tag} Write result.txt, then say what 6*7 is.", "answer": "42"}],
        evaluator="exact_match",
        runtime={"prepare": {"commands": ["git init -q"]}},
        timeouts={"agent_s": 120},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    assert len(calls) == 2, explain(run)
    assert all(call.api_type == api for call in calls), [c.api_type for c in calls]
    assert all(call.purpose == "agent" for call in calls)
    assert rollout.reward == 1.0, explain(run)

    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "transcript", "workspace.diff"} <= set(artifacts), sorted(artifacts)
    transcript = json.loads(artifacts["transcript"])
    assert transcript["api"] == api and transcript["error"] is None
    assert transcript["final_output"] == "The file is written. ANSWER: 42"
    # the tool really ran: its output went back to the model, and its file is in the diff
    outputs = [i for i in transcript["items"] if i.get("type") == "function_call_output"]
    assert outputs and "exit code 0" in str(outputs[0]["output"]), transcript["items"]
    diff = artifacts["workspace.diff"].decode()
    assert "result.txt" in diff and "+forty-two" in diff, diff
    assert ".polar" not in diff
    # the second call carried the tool's result back to the model
    second = json.dumps(calls[1].request)
    assert "exit code 0" in second
    print(f"openai_agents[{api}]: {len(calls)} calls, {run.seconds:.1f}s")


def test_openai_agents_stops_at_max_turns(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("openai_agents")
    loop = {"tool": "run_shell", "arguments": {"command": "echo again"}}
    tag = preset_stack.plan("openai_agents_loop", {"turns": [loop] * 10})
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "openai_agents", "options": {"api": "chat", "max_turns": 2}},
        [{"instruction": f"{tag} Loop.", "answer": "42"}],
        evaluator="exact_match",
        timeouts={"agent_s": 120},
    )
    rollout = run.rollouts[0]
    assert rollout.termination_reason == "agent_error", explain(run)
    assert rollout.agent_exit_code == 2, explain(run)
    assert len(run.calls[rollout.id]) == 2
    transcript = json.loads(run.artifacts[rollout.id]["transcript"])
    assert "MaxTurnsExceeded" in transcript["error"]
