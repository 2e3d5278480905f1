"""mini-swe-agent, installed from PyPI and run unmodified through the real pipeline and proxy.

The scripted fake engine drives mini's own `bash` tool: it writes answer.txt, then submits with
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt`. The submission is the answer the
rollout is graded on; the trajectory and the workspace diff (a git workspace) are stored.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    model_sandbox,
    run_preset,
)
from tests.e2e.stack import real_vllm_stack

pytestmark = pytest.mark.e2e

GIT_INIT = (
    "git init -q && git -c user.name=polar -c user.email=polar@example.com "
    "commit -q --allow-empty -m init"
)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"


@pytest.mark.parametrize("kind", ["local", "bwrap", "bwrap-proxy_only"])
def test_mini_swe_agent_runs_a_bash_tool_and_submits(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session], kind: str
) -> None:
    """Also in a bwrap sandbox, where the install is mounted read-only."""
    network = "proxy_only" if kind == "bwrap-proxy_only" else "host"  # proxy_only: that alone
    kind = kind.removesuffix("-proxy_only")
    if kind == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
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
        runtime={"kind": kind, "network": network, "prepare": {"commands": [GIT_INIT]}},
        timeouts={"agent_s": 120},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    print(f"mini_swe_agent ({kind}): {len(calls)} calls, {run.seconds:.1f}s")
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


SHORT_SYSTEM = "You are a helpful assistant that runs bash commands with the bash tool."
SHORT_INSTANCE = (
    "{{task}}\nCall the bash tool with one command per reply. "
    "When done, run: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
)
REAL_TASK = "Create a file hello.txt that contains the word hi, then finish."


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_mini_swe_agent_on_real_vllm_stores_the_engines_token_ids(
    real_vllm: Any,
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
) -> None:
    """SmolLM2-135M (2k context) drives mini through the proxy: with mini's own prompt (one step)
    and with a short one (three steps). Whatever the small model does, each rollout ends with a
    recorded reason, and every stored call's ids are exactly what vLLM returned."""
    install_preset("mini_swe_agent")
    options = [
        {"max_turns": 1, "model_attempts": 1},
        {
            "max_turns": 3,
            "model_attempts": 1,
            "system_template": SHORT_SYSTEM,
            "instance_template": SHORT_INSTANCE,
        },
    ]
    with real_vllm_stack(pg_url, tmp_path, real_vllm.base_url) as stack:
        runs = [
            run_preset(
                PresetStack(stack, tmp_path),
                db_session_factory,
                {"type": "mini_swe_agent", "options": option},
                [{"instruction": REAL_TASK}],
                evaluator="completed",
                sampling={"temperature": 0.7, "max_tokens": 96},
                timeouts={"agent_s": 240},
                runtime=model_sandbox(),
                timeout=600,
            )
            for option in options
        ]
    for label, run in zip(("default prompt", "short prompt"), runs, strict=True):
        rollout = run.rollouts[0]
        calls = run.calls[rollout.id]
        sizes = [len(c.prompt_ids or []) for c in calls]
        trajectory = json.loads(run.artifacts[rollout.id].get("trajectory", b"{}"))
        print(
            f"mini_swe_agent on vLLM ({label}): {rollout.termination_reason} "
            f"({trajectory.get('info', {}).get('exit_status')}), {len(calls)} calls, "
            f"prompt tokens {sizes}, {run.seconds:.1f}s"
        )
        assert rollout.termination_reason is not None, explain(run)
        assert rollout.termination_reason in ("completed", "agent_error", "timeout"), explain(run)
        ok = [c for c in calls if c.status_code == 200]
        assert ok, explain(run)
        for call in ok:
            response = call.response
            assert response is not None
            assert call.prompt_ids == response["prompt_token_ids"]
            assert call.completion_ids == response["choices"][0]["token_ids"]
            assert call.engine_request is not None
            assert call.engine_request["temperature"] == 0.7
        assert "trajectory" in run.artifacts[rollout.id], explain(run)
