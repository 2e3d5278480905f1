"""The `qwen_code` preset end to end: the real Qwen Code through the real pipeline and proxy.

Two tasks in one job. In the first the scripted fake engine drives Qwen Code through its own
`run_shell_command` tool (writing a file) and a final answer. In the second it answers at once;
Qwen Code then runs its memory-extraction agent, whose call the script answers wrongly: that call
is stored as auxiliary, never a sample, and the rollout is graded on the main loop's answer.
"""

from __future__ import annotations

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

MEMORY = {"when": {"system_contains": "memory extraction subagent"}, "text": "ANSWER: 7"}


def test_qwen_code_runs_a_tool_and_its_memory_call_is_auxiliary(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("qwen_code")
    with_tool = preset_stack.plan(
        "qwen_tool",
        {
            "turns": [
                {"tool": "run_shell_command", "arguments": {"command": "echo 42 > result.txt"}},
                {"text": "ANSWER: 42"},
            ],
            "side": [MEMORY],
            "after": "ANSWER: 7",
        },
    )
    direct = preset_stack.plan(
        "qwen_direct", {"turns": [{"text": "ANSWER: 42"}], "side": [MEMORY], "after": "ANSWER: 7"}
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "qwen_code", "options": {"max_turns": 5}},
        [
            {"instruction": f"{with_tool} What is 6*7? Put it in result.txt.", "answer": "42"},
            {"instruction": f"{direct} What is 6*7?", "answer": "42"},
        ],
        evaluator="exact_match",
        runtime={"prepare": {"commands": ["git init -q"]}},
        timeouts={"agent_s": 240},
    )
    assert_captured(run, min_calls=2)
    print(f"qwen_code: {[len(c) for c in run.calls.values()]} calls, {run.seconds:.1f} s")
    by_plan = {("qwen_tool", "qwen_direct")[r.task_index]: r for r in run.rollouts}
    for rollout in run.rollouts:
        assert rollout.reward == 1.0, explain(run)
        assert "transcript" in run.artifacts[rollout.id]

    tool_rollout = by_plan["qwen_tool"]
    calls = run.calls[tool_rollout.id]
    main = [c for c in calls if c.purpose == "agent"]
    assert len(main) == 2
    assert any(m.get("role") == "tool" for m in main[1].request["messages"])
    artifacts = run.artifacts[tool_rollout.id]
    diff = artifacts["workspace.diff"].decode()
    assert "result.txt" in diff and "+42" in diff and ".polar" not in diff
    assert b"run_shell_command" in artifacts["transcript"]

    direct_calls = run.calls[by_plan["qwen_direct"].id]
    assert direct_calls[0].purpose == "agent"
    side = direct_calls[1:]
    assert side and all(c.purpose == "auxiliary" for c in side), [c.purpose for c in side]
