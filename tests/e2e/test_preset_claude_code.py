"""The `claude_code` preset: the real Claude Code CLI through the real pipeline and proxy.

The scripted fake drives it through its own `Bash` tool (writing a file in the workspace, a git
repository, so the file shows in the diff) and a final answer; the answer is graded by
`exact_match` on the main loop's last message. Claude Code's side calls (no tools: titles, topic
detection, quota probes) are stored as auxiliary and answered with a wrong answer, so grading one
would score 0.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import TrajectorySample
from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    run_preset,
)

pytestmark = pytest.mark.e2e

PLAN = {
    "turns": [
        {"tool": "Bash", "arguments": {"command": "echo 42 > result.txt", "description": "save"}},
        {"text": "ANSWER: 42"},
    ],
    "side": [{"when": {"no_tools": True}, "text": "ANSWER: 7"}],
    "after": "ANSWER: 7",
}
GIT_INIT = "git init -q . && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m init"


def test_claude_code_runs_a_tool_and_answers(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("claude_code")
    tag = preset_stack.plan("claude_code", PLAN)
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "claude_code", "options": {"max_turns": 5}},
        [{"instruction": f"{tag} Write 6*7 to result.txt, then answer.", "answer": "42"}],
        evaluator="exact_match",
        sampling={"temperature": 0.7, "max_tokens": 512},
        runtime={"prepare": {"commands": [GIT_INIT]}},
        timeouts={"agent_s": 240},
    )
    assert_captured(run)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    main = [c for c in calls if c.purpose != "auxiliary"]
    side = [c for c in calls if c.purpose == "auxiliary"]
    print(f"claude_code: {len(calls)} calls ({len(side)} auxiliary) in {run.seconds:.1f}s")
    assert len(main) == 2, [(c.purpose, c.api_type) for c in calls]
    for call in main:
        assert call.api_type == "anthropic_messages"
        assert call.engine_request is not None
        assert call.engine_request["max_tokens"] == 512  # Claude Code asked for 32000
        assert call.engine_request["temperature"] == 0.7
    # the tool really ran: its output came back in the next call, and the file is in the diff
    assert "tool_result" in json.dumps(main[1].request)
    artifacts = run.artifacts[rollout.id]
    assert (
        "+42" in artifacts["workspace.diff"].decode()
        and "result.txt" in artifacts["workspace.diff"].decode()
    )
    assert ".polar" not in artifacts["workspace.diff"].decode()
    transcript = [json.loads(line) for line in artifacts["transcript"].splitlines() if line]
    result = transcript[-1]
    assert result["type"] == "result" and result["result"] == "ANSWER: 42", result
    assert b'"type":"result"' in artifacts["agent.log"]
    assert rollout.reward == 1.0, explain(run)  # graded on the main loop, not a side call
    with db_session_factory() as session:
        samples = session.scalars(
            select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
        ).all()
    assert samples and all(s.response_ids for s in samples)
