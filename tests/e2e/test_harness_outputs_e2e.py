"""Side calls, answers and artifacts of a harness, through the real pipeline (command harness).

The agent (side_call_agent.py) asks for temperature 0 and 32,000 tokens, makes a tool call, gives
its answer, then a title call without tools. The job declares the title call auxiliary: it is
stored with purpose `auxiliary`, left out of the sample, and the answer is graded on the main
loop's last message (grading the title would score 0). The transcript and the workspace diff are
stored as artifacts and served by the API.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import TrajectorySample
from tests.e2e.preset_support import PresetStack, explain, run_preset
from tests.e2e.stack import client_of

pytestmark = pytest.mark.e2e

AGENT = Path(__file__).resolve().parent / "side_call_agent.py"
PLAN = {
    "turns": [
        {"tool": "write_notes", "arguments": {"text": "six times seven"}},
        {"text": "ANSWER: 42"},
    ],
    "side": [{"when": {"system_contains": "five-word title"}, "text": "ANSWER: 7"}],
}


def test_side_call_is_auxiliary_answer_from_main_loop_and_artifacts_stored(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    tag = preset_stack.plan("side_calls", PLAN)
    harness = {
        "type": "command",
        "command": f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENT))}",
        # the title call asks for 20 tokens, the main loop for 32,000: the rule reads what the
        # agent asked for, not the job's 256 that the proxy sent the engine for every call
        "auxiliary_calls": [{"max_tokens_at_most": 64}],
        "artifacts": {"transcript": "transcript.json"},
    }
    run = run_preset(
        preset_stack,
        db_session_factory,
        harness,
        [{"instruction": f"{tag} What is 6*7?", "answer": "42"}],
        samples_per_task=2,
        builder="prefix_merge",
        evaluator="exact_match",
        sampling={"temperature": 0.7, "max_tokens": 256},
    )
    assert len(run.rollouts) == 2
    for rollout in run.rollouts:
        assert rollout.termination_reason == "completed", explain(run)
        calls = run.calls[rollout.id]
        assert [c.purpose for c in calls] == ["agent", "agent", "auxiliary"]
        for call in calls[:2]:  # the job's sampling, whatever the harness asked for
            assert call.engine_request is not None
            assert call.engine_request["temperature"] == 0.7
            assert call.engine_request["max_tokens"] == 256
        assert rollout.reward == 1.0, explain(run)  # graded on the main loop, not "ANSWER: 7"
        with db_session_factory() as session:
            samples = session.scalars(
                select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
            ).all()
        assert len(samples) == 1  # the two main calls merged; the title call is not a sample
        first, second = calls[:2]
        assert samples[0].prompt_ids == first.prompt_ids
        assert samples[0].prompt_ids + samples[0].response_ids == (
            second.prompt_ids + second.completion_ids
        )
        artifacts = run.artifacts[rollout.id]
        assert set(artifacts) == {"agent.log", "transcript", "workspace.diff"}
        assert b"ANSWER: 42" in artifacts["transcript"]
        diff = artifacts["workspace.diff"].decode()
        assert "+six times seven" in diff and "notes.txt" in diff
        assert "task.json" not in diff and "transcript.json" in diff

    api = preset_stack.stack.settings
    rollout_id = run.rollouts[0].id
    base = f"http://{api.api_host}:{api.api_port}/v1/rollouts/{rollout_id}/artifacts"
    listing = httpx.get(base, timeout=10).json()
    assert {a["name"] for a in listing["artifacts"]} == {
        "agent.log",
        "transcript",
        "workspace.diff",
    }
    transcript = httpx.get(f"{base}/transcript", timeout=10)
    assert transcript.status_code == 200 and b"ANSWER: 42" in transcript.content
    missing = httpx.get(f"{base}/nope", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"

    summary = client_of(preset_stack.stack).export(
        run.job_id, tmp_path / "out.jsonl", artifacts_dir=tmp_path / "artifacts"
    )
    assert summary.rows == 2 and summary.artifacts == 6
    for rollout in run.rollouts:
        folder = tmp_path / "artifacts" / str(rollout.id)
        assert sorted(p.name for p in folder.iterdir()) == [
            "agent.log", "transcript", "workspace.diff"
        ]  # fmt: skip
        assert (folder / "transcript").read_bytes() == run.artifacts[rollout.id]["transcript"]


def test_harness_that_never_reaches_the_model_is_not_scored(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    """A harness that fails before its first LLM call (here: exits 3 with a message on stdout)
    is a setup failure, not the policy's: `runtime_error`, no reward, with its own words."""
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "command", "command": "echo 'the selected model may not exist'; exit 3"},
        [{"instruction": "What is 6*7?", "answer": "42"}],
        evaluator="exact_match",
    )
    (rollout,) = run.rollouts
    assert rollout.status == "failed" and rollout.termination_reason == "runtime_error"
    assert rollout.reward is None
    assert rollout.error is not None and "the selected model may not exist" in rollout.error
    assert "before any LLM call reached the proxy" in rollout.error
