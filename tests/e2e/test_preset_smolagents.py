"""smolagents, installed from PyPI and run by its shipped driver through the real pipeline.

The scripted fake engine drives a ToolCallingAgent: it calls smolagents' own python_interpreter
tool, sees the result, then calls final_answer. The driver writes the final answer (graded) and
the agent's memory (the transcript artifact).
"""

from __future__ import annotations

import json
import shutil

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


@pytest.mark.parametrize("kind", ["local", "bwrap-host", "bwrap"])
def test_smolagents_tool_calling_agent_uses_its_python_tool_and_answers(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session], kind: str
) -> None:
    """Also in a bwrap sandbox, where the install is mounted read-only: with the node's network
    when the job asks for `host`, else with the `proxy_only` network an untrusted preset gets by
    default (the agent reaches the proxy through the in-sandbox forwarder only)."""
    runtime = {"kind": kind}
    if kind == "bwrap-host":
        runtime = {"kind": "bwrap", "network": "host"}
    if kind != "local" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    install_preset("smolagents")
    tag = preset_stack.plan(
        "smolagents",
        {
            "turns": [
                {"tool": "python_interpreter", "arguments": {"code": "print(6 * 7)"}},
                {"tool": "final_answer", "arguments": {"answer": "42"}},
            ],
            "after": "41",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "smolagents", "options": {"max_turns": 4}},
        [{"instruction": f"{tag} What is 6*7? Use Python.", "answer": "42"}],
        evaluator="exact_match",
        runtime=runtime,
        timeouts={"agent_s": 120},
    )
    expected = {"local": "host", "bwrap-host": "host", "bwrap": "proxy_only"}[kind]
    assert run.runtime["network"] == expected, run.runtime
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    print(f"smolagents ({kind}): {len(calls)} calls, {run.seconds:.1f}s")
    assert len(calls) == 2, explain(run)
    assert all(c.purpose == "agent" for c in calls)
    tools = {t["function"]["name"] for t in calls[0].request["tools"]}
    assert tools == {"python_interpreter", "final_answer"}
    # the tool really ran: its output is in the next call's conversation
    assert "42" in json.dumps(calls[1].request["messages"][2:])
    assert rollout.reward == 1.0, explain(run)

    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "transcript"} <= set(artifacts), explain(run)
    transcript = json.loads(artifacts["transcript"])
    assert transcript["state"] == "success" and transcript["output"] == "42"
    observations = [s.get("observations") or "" for s in transcript["steps"]]
    assert any("Stdout:\n42" in o for o in observations), observations


def test_smolagents_code_agent_runs_its_code_and_answers(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    install_preset("smolagents")
    code = "Thought: compute it.\n<code>\nvalue = 6 * 7\nprint(value)\n</code>"
    answer = "Thought: done.\n<code>\nfinal_answer(str(value))\n</code>"
    tag = preset_stack.plan("smolagents_code", {"turns": [{"text": code}, {"text": answer}]})
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "smolagents", "options": {"agent": "code", "tools": [], "max_turns": 4}},
        [{"instruction": f"{tag} What is 6*7?", "answer": "42"}],
        evaluator="exact_match",
        timeouts={"agent_s": 120},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    print(f"smolagents (code): {len(calls)} calls, {run.seconds:.1f}s")
    assert len(calls) == 2, explain(run)
    assert "42" in json.dumps(calls[1].request["messages"][-1])  # the code's printed output
    assert rollout.reward == 1.0, explain(run)
    transcript = json.loads(run.artifacts[rollout.id]["transcript"])
    assert transcript["state"] == "success" and transcript["output"] == "42"
