"""The `gemini_cli` preset: the real Gemini CLI through the real pipeline and proxy.

The scripted fake drives it through a tool of an MCP server given in `options` (the answer
comes back in the next request), then its own `run_shell_command` tool (writing a file in the
workspace, a git repository, so the file shows in the diff) and a final answer; the answer is
graded by `exact_match` on the main loop's last message. Gemini CLI's side calls (no tools: routing
classifier, next-speaker and loop checks) would be stored as auxiliary and are answered with a wrong
answer, so grading one would score 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
        {"tool": "mcp_calc_add", "arguments": {"a": 40, "b": 2}},
        {"tool": "run_shell_command", "arguments": {"command": "echo 42 > result.txt"}},
        {"text": "ANSWER: 42"},
    ],
    "side": [{"when": {"no_tools": True}, "text": "ANSWER: 7"}],
    "after": "ANSWER: 7",
}
MCP = {
    "calc": {
        "command": sys.executable,
        "args": [str(Path(__file__).with_name("mcp_calc_server.py"))],
    }
}
SKILL = "---\nname: arith\ndescription: Careful arithmetic steps\n---\nAdd carefully.\n"
GIT_INIT = "git init -q . && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m init"


def test_gemini_cli_runs_a_tool_and_answers(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("gemini_cli")
    tag = preset_stack.plan("gemini_cli", PLAN)
    run = run_preset(
        preset_stack,
        db_session_factory,
        {
            "type": "gemini_cli",
            "options": {"max_turns": 5, "mcp_servers": MCP, "skills": {"arith": SKILL}},
        },
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
    print(f"gemini_cli: {len(calls)} calls ({len(side)} auxiliary) in {run.seconds:.1f}s")
    assert len(main) == 3, [(c.purpose, c.api_type) for c in calls]
    for call in main:
        assert call.api_type == "gemini"
        assert call.engine_request is not None
        assert call.engine_request["max_tokens"] == 512
        assert call.engine_request["temperature"] == 0.7
    # the tool really ran: its output came back in the next call, and the file is in the diff
    offered = [t["function"]["name"] for t in main[0].engine_request["tools"]]
    assert "mcp_calc_add" in offered  # the MCP server from options, in the harness's own config
    assert "Careful arithmetic steps" in json.dumps(main[0].request)  # the skill is offered
    tool_messages = [m for m in main[1].engine_request["messages"] if m["role"] == "tool"]
    assert tool_messages, main[1].engine_request
    assert "The sum is 42." in json.dumps(tool_messages[-1]["content"]), tool_messages[-1][
        "content"
    ]
    assert "functionResponse" in json.dumps(main[2].request)
    artifacts = run.artifacts[rollout.id]
    assert (
        "+42" in artifacts["workspace.diff"].decode()
        and "result.txt" in artifacts["workspace.diff"].decode()
    )
    assert ".polar" not in artifacts["workspace.diff"].decode()
    transcript = [json.loads(line) for line in artifacts["transcript"].splitlines() if line]
    assert transcript[-1]["type"] == "result", transcript[-1]
    said = "".join(
        e.get("content", "")
        for e in transcript
        if e["type"] == "message" and e.get("role") == "assistant"
    )
    assert "ANSWER: 42" in said, transcript
    assert b'"type":"result"' in artifacts["agent.log"]
    assert rollout.reward == 1.0, explain(run)  # graded on the main loop, not a side call
    with db_session_factory() as session:
        samples = session.scalars(
            select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
        ).all()
    assert samples and all(s.response_ids for s in samples)
