"""The `codex` preset end to end: the real Codex CLI through the real pipeline and proxy.

The scripted fake engine drives Codex through its own `exec_command` tool (writing a file) and a
final answer. Codex speaks the Responses API (streamed, `store: false`, the whole history each
turn); the proxy translates it to the engine's chat and captures every call with token ids. The
answer is graded from Codex's `--output-last-message` file, the session transcript is stored, and
the file the tool wrote shows in the workspace diff.
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

GIT_INIT = {"prepare": {"commands": ["git init -q"]}}


def test_codex_runs_a_tool_and_answers(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("codex")
    tag = preset_stack.plan(
        "codex",
        {
            "turns": [
                {"tool": "exec_command", "arguments": {"cmd": "echo 42 > result.txt"}},
                {"text": "ANSWER: 42"},
            ],
            "after": "ANSWER: 7",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "codex"},
        [{"instruction": f"{tag} What is 6*7? Put it in result.txt.", "answer": "42"}],
        evaluator="exact_match",
        runtime=GIT_INIT,
        timeouts={"agent_s": 180},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    assert [c.purpose for c in calls] == ["agent", "agent"]  # codex exec makes no side calls
    assert all(c.api_type == "responses" for c in calls)
    assert rollout.reward == 1.0, explain(run)

    # the tool really ran: its output came back in the next call, and its file is in the diff
    second = calls[1].engine_request
    assert second is not None
    tool_messages = [m for m in second["messages"] if m.get("role") == "tool"]
    assert tool_messages and "exited with code 0" in str(tool_messages[0]["content"])
    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "transcript", "workspace.diff"} <= set(artifacts)
    diff = artifacts["workspace.diff"].decode()
    assert "result.txt" in diff and "+42" in diff and ".polar" not in diff
    events = [json.loads(line) for line in artifacts["transcript"].splitlines() if line.strip()]
    assert any("exec_command" in json.dumps(e) for e in events)
    assert b'"turn.completed"' in artifacts["agent.log"]  # the --json event stream
