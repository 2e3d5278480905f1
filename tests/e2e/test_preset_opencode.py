"""The `opencode` preset end to end: the real opencode through the real pipeline and proxy.

The scripted fake engine drives opencode through its own `bash` tool (writing a file) and a final
answer, and answers opencode's title-generation side call with a wrong answer: that call is stored
as auxiliary and the rollout is graded on the main loop. The npm registry is pointed at a dead
address for the agent, so the run shows opencode needs no network beyond the proxy (its
`@ai-sdk/openai-compatible` adapter is bundled, nothing is installed at run time).
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

DEAD = "http://127.0.0.1:9/"
NO_REGISTRY = {
    "BUN_CONFIG_REGISTRY": DEAD,
    "NPM_CONFIG_REGISTRY": DEAD,
    "npm_config_registry": DEAD,
}


def test_opencode_runs_a_tool_and_answers_title_call_is_auxiliary(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("opencode")
    tag = preset_stack.plan(
        "opencode",
        {
            "turns": [
                {
                    "tool": "bash",
                    "arguments": {"command": "echo 42 > result.txt", "description": "save it"},
                },
                {"text": "ANSWER: 42"},
            ],
            "side": [
                {"when": {"system_contains": "You are a title generator"}, "text": "ANSWER: 7"}
            ],
            "after": "ANSWER: 7",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "opencode", "env": NO_REGISTRY, "options": {"max_turns": 5}},
        [{"instruction": f"{tag} What is 6*7? Put it in result.txt.", "answer": "42"}],
        evaluator="exact_match",
        runtime={"prepare": {"commands": ["git init -q"]}},
        timeouts={"agent_s": 240},
    )
    assert_captured(run, min_calls=3)
    print(f"opencode: {[len(c) for c in run.calls.values()]} calls, {run.seconds:.1f} s")
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    assert sorted(c.purpose for c in calls) == ["agent", "agent", "auxiliary"], explain(run)
    (title,) = [c for c in calls if c.purpose == "auxiliary"]
    assert not title.request.get("tools")
    assert rollout.reward == 1.0, explain(run)  # the main loop's answer, not the title's

    main = [c for c in calls if c.purpose == "agent"]
    tool_messages = [m for m in main[1].request["messages"] if m.get("role") == "tool"]
    assert tool_messages, main[1].request["messages"]
    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "transcript", "workspace.diff"} <= set(artifacts)
    diff = artifacts["workspace.diff"].decode()
    assert "result.txt" in diff and "+42" in diff and ".polar" not in diff
    events = [json.loads(line) for line in artifacts["transcript"].splitlines() if line.strip()]
    assert any(e.get("type") == "tool_use" for e in events), events
