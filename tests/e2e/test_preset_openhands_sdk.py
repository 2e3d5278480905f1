"""The `openhands_sdk` preset end to end: the real OpenHands SDK (by its driver, on Python 3.12),
the real proxy and pipeline, the scripted fake engine.

The plan makes the agent call the SDK's own `terminal` tool (writing a file into the workspace, a
git repository, so the file shows in `workspace.diff`), then its `finish` tool with the answer.
The answer is the finish message (the driver's answer file), graded by `exact_match`.
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


def test_openhands_sdk_runs_its_terminal_and_finishes(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("openhands_sdk")
    tag = preset_stack.plan(
        "openhands_sdk",
        {
            "turns": [
                {
                    "tool": "terminal",
                    "arguments": {"command": "echo forty-two > result.txt", "security_risk": "LOW"},
                },
                {"tool": "finish", "arguments": {"message": "Done. ANSWER: 42"}},
            ],
            "after": "ANSWER: 42",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "openhands_sdk", "options": {"max_turns": 5}},
        [{"instruction": f"{tag} Write result.txt, then say what 6*7 is.", "answer": "42"}],
        evaluator="exact_match",
        runtime={"prepare": {"commands": ["git init -q"]}},
        timeouts={"agent_s": 180},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    print(f"openhands_sdk: {len(calls)} calls, {run.seconds:.1f}s")
    assert len(calls) == 2, explain(run)
    assert all(call.api_type == "chat" and call.purpose == "agent" for call in calls)
    assert rollout.reward == 1.0, explain(run)

    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "transcript", "workspace.diff"} <= set(artifacts), sorted(artifacts)
    events = [json.loads(line) for line in artifacts["transcript"].decode().splitlines()]
    assert any(e.get("kind") == "ObservationEvent" for e in events), [e.get("kind") for e in events]
    diff = artifacts["workspace.diff"].decode()
    assert "result.txt" in diff and "+forty-two" in diff, diff
    assert ".polar" not in diff
    # the second call carried the terminal's result back to the model
    tool_messages = [m for m in calls[1].request["messages"] if m.get("role") == "tool"]
    assert tool_messages, calls[1].request["messages"]


def test_openhands_sdk_stops_at_max_turns(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("openhands_sdk")
    loop = {"tool": "terminal", "arguments": {"command": "echo again", "security_risk": "LOW"}}
    tag = preset_stack.plan("openhands_sdk_loop", {"turns": [loop] * 10})
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "openhands_sdk", "options": {"max_turns": 2}},
        [{"instruction": f"{tag} Loop.", "answer": "42"}],
        evaluator="exact_match",
        timeouts={"agent_s": 180},
    )
    rollout = run.rollouts[0]
    assert rollout.termination_reason == "agent_error", explain(run)
    assert rollout.agent_exit_code == 2, explain(run)
    assert len(run.calls[rollout.id]) == 2
    events = run.artifacts[rollout.id]["transcript"].decode()
    assert "MaxIterationsReached" in events
