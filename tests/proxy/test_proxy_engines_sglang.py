"""The SGLang engine: what the agent asked for survives, what we added does not, odd cases hold.

The golden test (`test_proxy_golden_engines`) pins equality with vLLM; these cover what is
SGLang's own: agents that ask for `sglext` ids themselves, SGLang's refusal of streamed
`return_token_ids`, streams that end before the ids arrive, and the OpenAI SDK over sockets.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from proxy_support import SECRET, Harness, proxy_settings, start_harness

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.proxy.engines import sglang
from polar_mq.proxy.engines.base import CHAT
from polar_mq.testing.fake_sglang import create_fake_sglang_app
from polar_mq.testing.servers import serve_in_thread

CHAT_PATH = "/v1/chat/completions"
QUESTION: Any = [{"role": "user", "content": "What is 6 * 7?"}]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    settings = proxy_settings(upstream_engine="sglang")
    async for h in start_harness(settings, create_fake_sglang_app(), streaming=True):
        yield h


def sse_payloads(raw: bytes) -> list[dict[str, Any]]:
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_agent_asking_for_output_ids_gets_exactly_those(
    harness: Harness, stream: bool
) -> None:
    body = {
        "model": "my-policy",
        "messages": QUESTION,
        "stream": stream,
        "return_output_ids_in_sglext": True,
    }
    response = await harness.post(CHAT_PATH, body)
    assert response.status_code == 200
    (row,) = await harness.rows()
    if stream:
        exts = [p["sglext"] for p in sse_payloads(response.content) if "sglext" in p]
    else:
        exts = [response.json()["sglext"]]
    assert exts == [{"output_ids": [row["completion_ids"]]}]  # no input_ids: it did not ask
    assert row["prompt_ids"] and row["completion_ids"][-1] == 2


@pytest.mark.anyio
async def test_agent_return_token_ids_non_streaming_is_kept(harness: Harness) -> None:
    body = {"model": "my-policy", "messages": QUESTION, "return_token_ids": True}
    response = await harness.post(CHAT_PATH, body)
    choice = response.json()["choices"][0]
    (row,) = await harness.rows()
    assert choice["response_token_ids"] == row["completion_ids"]
    assert choice["prompt_token_ids"] == row["prompt_ids"]
    assert choice["logprobs"] is None  # not asked: stripped though we had asked SGLang for them
    assert "sglext" not in response.json()


@pytest.mark.anyio
async def test_streamed_return_token_ids_is_sglangs_refusal_passed_through(
    harness: Harness,
) -> None:
    """The agent's own request, as SGLang answers it: 400, logged as an incomplete call."""
    body = {"model": "my-policy", "messages": QUESTION, "stream": True, "return_token_ids": True}
    response = await harness.post(CHAT_PATH, body)
    assert response.status_code == 400
    assert "not supported with streaming" in response.json()["error"]["message"]
    (row,) = await harness.rows()
    assert (row["status_code"], row["complete"], row["completion_ids"]) == (400, False, None)


def test_stream_cut_before_the_sglext_chunk_has_no_ids() -> None:
    """Text arrived but the ids never did: store "unknown" (None), never an empty id list."""
    capture = sglang.stream_capture(CHAT)
    lp = {"content": [{"token": "4", "logprob": -0.5, "bytes": [52], "top_logprobs": []}]}
    chunk = {"choices": [{"index": 0, "delta": {"content": "4"}, "logprobs": lp}]}
    assert capture.feed(chunk) is True
    result = capture.result()
    assert (result.completion_ids, result.logprobs, result.finish_reason) == (None, None, None)
    assert capture.summary()["text"] == "4"


def test_logprobs_are_dropped_when_a_token_chunk_had_none() -> None:
    capture = sglang.stream_capture(CHAT)
    capture.feed({"choices": [{"index": 0, "delta": {"content": "4"}, "logprobs": None}]})
    capture.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    capture.feed({"choices": [], "sglext": {"input_ids": [1, 5], "output_ids": [[55, 2]]}})
    result = capture.result()
    assert (result.prompt_ids, result.completion_ids) == ([1, 5], [55, 2])
    assert result.logprobs is None and result.finish_reason == "stop"


def test_meta_info_fallback_is_not_needed_but_response_token_ids_is_read() -> None:
    data = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "4"},
                "logprobs": {"content": [{"logprob": -0.25}, {"logprob": -0.5}]},
                "finish_reason": "stop",
                "prompt_token_ids": [1, 2, 3],
                "response_token_ids": [55, 2],
            }
        ]
    }
    capture = sglang.extract_response(CHAT, data)
    assert (capture.prompt_ids, capture.completion_ids) == ([1, 2, 3], [55, 2])
    assert capture.logprobs == [-0.25, -0.5]


def test_openai_sdk_streams_through_the_proxy_over_sockets() -> None:
    """Real HTTP both ways; the SDK copes with the (stripped) `choices: []` sglext chunk."""
    import openai  # here only: every xdist worker collects this file

    sink = MemoryCallSink()
    with serve_in_thread(create_fake_sglang_app(ttft_s=0.002)) as upstream:
        settings = proxy_settings(upstream_engine="sglang", upstream_url=upstream)
        with serve_in_thread(create_proxy_app(settings, sink=sink), server="lean") as proxy:
            token = issue_rollout_token(SECRET, uuid.uuid4(), 60)
            client = openai.OpenAI(base_url=proxy + "/v1", api_key=token, max_retries=0)
            stream = client.chat.completions.create(
                model="my-policy", messages=QUESTION, stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            plain = client.chat.completions.create(model="my-policy", messages=QUESTION)
    assert text == plain.choices[0].message.content == "CALC: 6 * 7"
    streamed, whole = sink.rows
    assert streamed["completion_ids"] == whole["completion_ids"] and streamed["complete"]
    assert streamed["logprobs"] == whole["logprobs"] and len(whole["logprobs"]) == 12
