"""The `claude_code` preset: the real Claude Code CLI through the real pipeline and proxy.

The scripted fake drives it through a tool of an MCP server given in `options` (the answer
comes back in the next request), then its own `Bash` tool (writing a file in the workspace, a git
repository, so the file shows in the diff) and a final answer; the answer is graded by
`exact_match` on the main loop's last message. Claude Code's side calls (no tools: titles, topic
detection, quota probes) are stored as auxiliary and answered with a wrong answer, so grading one
would score 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.inference import local_vllm
from polar_mq.models import LlmCall, Rollout, RolloutArtifact, TrajectorySample
from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    model_sandbox,
    run_preset,
)
from tests.e2e.stack import client_of, real_vllm_stack

pytestmark = pytest.mark.e2e

PLAN = {
    "turns": [
        {"tool": "mcp__calc__add", "arguments": {"a": 40, "b": 2}},
        {"tool": "Bash", "arguments": {"command": "echo 42 > result.txt", "description": "save"}},
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


def test_claude_code_runs_a_tool_and_answers(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("claude_code")
    tag = preset_stack.plan("claude_code", PLAN)
    run = run_preset(
        preset_stack,
        db_session_factory,
        {
            "type": "claude_code",
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
    print(f"claude_code: {len(calls)} calls ({len(side)} auxiliary) in {run.seconds:.1f}s")
    assert len(main) == 3, [(c.purpose, c.api_type) for c in calls]
    for call in main:
        assert call.api_type == "anthropic_messages"
        assert call.engine_request is not None
        assert call.engine_request["max_tokens"] == 512
        assert call.request["max_tokens"] == 512  # told the job's budget (it asks 32000 untold)
        assert call.engine_request["temperature"] == 0.7
    # the tool really ran: its output came back in the next call, and the file is in the diff
    offered = [t["function"]["name"] for t in main[0].engine_request["tools"]]
    assert "mcp__calc__add" in offered  # the MCP server from options, in the harness's own config
    assert "Careful arithmetic steps" in json.dumps(main[0].request)  # the skill is offered
    tool_messages = [m for m in main[1].engine_request["messages"] if m["role"] == "tool"]
    assert tool_messages and "The sum is 42." in json.dumps(
        tool_messages[-1]["content"]
    )  # the MCP answer
    assert "tool_result" in json.dumps(main[2].request)
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


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)  # the first vLLM test of a session also starts the server
def test_claude_code_on_real_vllm_stores_the_servers_ids(
    real_vllm: Any, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    """SmolLM2-135M behind the proxy: Claude Code's prompt shrunk (a one-line system prompt, only
    the Bash tool) to fit the server's context. The small model need not solve the task; the
    rollout must end with a recorded reason, and every successful call's ids must be vLLM's own:
    the prompt ids are what vLLM's tokenizer makes of the chat request it was sent, and the
    completion ids detokenize to the text the proxy returned."""
    install_preset("claude_code")
    harness = {
        "type": "claude_code",
        "options": {"max_turns": 2, "system_prompt": "You are a helpful agent.", "tools": ["Bash"]},
    }
    with real_vllm_stack(pg_url, tmp_path, real_vllm.base_url) as stack:
        client = client_of(stack)
        job = client.submit(
            [{"instruction": "What is 6*7? Reply with the number.", "answer": "42"}],
            harness=harness,
            evaluator="exact_match",
            sampling={"temperature": 0.7, "max_tokens": 48},
            timeouts={"agent_s": 240},
            runtime=model_sandbox(),
        )
        client.wait(str(job.job_id), progress=False, timeout=600)
    with db_session_factory() as session:
        (rollout,) = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        calls = session.scalars(
            select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
        ).all()
        log = session.scalars(
            select(RolloutArtifact.content).where(
                RolloutArtifact.rollout_id == rollout.id, RolloutArtifact.name == "agent.log"
            )
        ).first()
    tail = bytes(log or b"")[-2000:].decode(errors="replace")
    assert rollout.termination_reason is not None, (rollout.status, tail)
    ok = [c for c in calls if c.status_code == 200 and c.complete]
    assert ok, (rollout.termination_reason, rollout.error, [c.status_code for c in calls], tail)
    print(
        f"claude_code on vLLM: {rollout.termination_reason}, {len(calls)} calls "
        f"({[(c.status_code, c.finish_reason, len(c.prompt_ids or [])) for c in calls]}), "
        f"error: {rollout.error}"
    )
    with httpx.Client(base_url=real_vllm.base_url, timeout=60) as http:
        for call in ok:
            sent = call.engine_request
            assert sent is not None and sent["model"] == local_vllm.SERVED_MODEL
            assert call.prompt_ids and call.completion_ids
            response = call.response or {}
            if "prompt_token_ids" in response:  # the engine's own answer, as stored
                assert call.prompt_ids == response["prompt_token_ids"]
                assert call.completion_ids == response["choices"][0]["token_ids"]
            body = {
                "model": local_vllm.SERVED_MODEL,
                "messages": sent["messages"],
                "add_generation_prompt": True,
            }
            if sent.get("tools"):
                body["tools"] = sent["tools"]
            tokenized = http.post("/tokenize", json=body)
            assert tokenized.status_code == 200, tokenized.text
            assert call.prompt_ids == tokenized.json()["tokens"]
            assert len(call.logprobs or []) == len(call.completion_ids)
