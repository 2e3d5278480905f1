"""The fake vLLM engine: field-for-field shape of real vLLM 0.32 responses, and its behaviour."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from polar_mq.testing.fake_tokenizer import encode
from polar_mq.testing.fake_vllm import create_fake_vllm_app

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parents[1] / "proxy" / "fixtures" / "vllm-0.32.0-cpu"
QUESTION = [{"role": "user", "content": "What is 17 + 25?"}]
WANT_ALL = {"return_token_ids": True, "logprobs": True, "top_logprobs": 2}


@pytest.fixture
async def fake() -> AsyncIterator[httpx.AsyncClient]:
    app = create_fake_vllm_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fake") as c:
        yield c


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def recorded_stream(name: str) -> list[dict[str, Any]]:
    events = (FIXTURES / name).read_bytes().split(b"\n\n")
    return [orjson.loads(e[6:]) for e in events if e.startswith(b"data: {")]


def sse(raw: bytes) -> list[dict[str, Any]]:
    events = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def shape(value: Any, key: str = "", leaf: Any = None) -> Any:
    """Key order and nesting of a JSON value, with lists reduced to their first element.

    Leaves are their type name (or `leaf` when given); the completions API's `top_logprobs` maps
    (token -> logprob) are data, not structure.
    """
    if isinstance(value, dict):
        if key == "top_logprobs":
            return "token map"
        return [(k, shape(v, k, leaf)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(value[0], key, leaf)] if value else []
    if leaf is not None:
        return leaf
    return type(value).__name__ if value is not None else None


def loose(value: Any) -> Any:
    """Like `shape` but ignoring scalar types (null vs value) at the leaves."""
    return shape(value, leaf="scalar")


async def test_chat_response_has_vllm_shape(fake: httpx.AsyncClient) -> None:
    body = {"model": "fake-model", "messages": QUESTION, **WANT_ALL}
    data = (await fake.post("/v1/chat/completions", json=body)).json()
    assert loose(data) == loose(recorded("vllm_chat_response.json"))
    choice = data["choices"][0]
    assert choice["token_ids"][-1] == 2 and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["content"][-1]["token"] == "<|im_end|>"
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert choice["message"]["content"] == "CALC: 17 + 25"
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert data["usage"]["prompt_tokens"] == len(data["prompt_token_ids"])


async def test_completions_response_has_vllm_shape(fake: httpx.AsyncClient) -> None:
    body = {"prompt": "17 + 25 =", "logprobs": 2, "return_token_ids": True, "max_tokens": 64}
    data = (await fake.post("/v1/completions", json=body)).json()
    assert loose(data) == loose(recorded("vllm_completions_response.json"))
    choice = data["choices"][0]
    assert choice["prompt_token_ids"] == encode("17 + 25 =")
    logprobs = choice["logprobs"]
    assert logprobs["tokens"][-1] == "<|im_end|>" and choice["token_ids"][-1] == 2
    assert logprobs["text_offset"][-1] == len(choice["text"])
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


async def test_chat_stream_has_vllm_shape(fake: httpx.AsyncClient) -> None:
    body = {
        "messages": QUESTION,
        "stream": True,
        "max_tokens": 6,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 1,
    }
    events = sse((await fake.post("/v1/chat/completions", json=body)).content)
    real = recorded_stream("vllm_chat_stream.txt")
    assert [shape(e) for e in events] == [shape(e) for e in real]


async def test_completions_stream_has_vllm_shape(fake: httpx.AsyncClient) -> None:
    body = {
        "prompt": "17 + 25 =",
        "stream": True,
        "max_tokens": 3,
        "logprobs": 1,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    events = sse((await fake.post("/v1/completions", json=body)).content)
    real = recorded_stream("vllm_completions_stream.txt")
    assert [loose(e) for e in events] == [loose(e) for e in real]
    assert [e["choices"][0]["logprobs"]["text_offset"] for e in events[:3]] == [[0], [1], [2]]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_and_non_stream_agree(fake: httpx.AsyncClient, path: str) -> None:
    body: dict[str, Any] = {"return_token_ids": True, "logprobs": True if "chat" in path else 0}
    body.update({"messages": QUESTION} if "chat" in path else {"prompt": "a b c"})
    whole = (await fake.post(path, json=body)).json()
    events = sse((await fake.post(path, json={**body, "stream": True})).content)
    ids = [i for e in events for c in e["choices"] for i in c.get("token_ids") or []]
    assert ids == whole["choices"][0]["token_ids"]
    if "chat" in path:
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        assert events[0]["prompt_token_ids"] == whole["prompt_token_ids"]
        assert text == whole["choices"][0]["message"]["content"]
    else:
        text = "".join(e["choices"][0]["text"] for e in events)
        assert (
            events[0]["choices"][0]["prompt_token_ids"] == whole["choices"][0]["prompt_token_ids"]
        )
        assert text == whole["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
async def test_token_fields_only_when_requested(fake: httpx.AsyncClient, stream: bool) -> None:
    response = await fake.post(
        "/v1/chat/completions", json={"messages": QUESTION, "stream": stream}
    )
    assert b"token_ids" not in response.content
    chunks = sse(response.content) if stream else [response.json()]
    assert all(c["logprobs"] is None for chunk in chunks for c in chunk["choices"])


async def test_conversation_keeps_the_token_prefix(fake: httpx.AsyncClient) -> None:
    messages: list[dict[str, Any]] = list(QUESTION)
    previous: list[int] | None = None
    for follow_up in ("RESULT: 42", "Thanks! And 2 * 3?"):
        data = (
            await fake.post(
                "/v1/chat/completions", json={"messages": messages, "return_token_ids": True}
            )
        ).json()
        prompt, completion = data["prompt_token_ids"], data["choices"][0]["token_ids"]
        if previous is not None:
            assert prompt[: len(previous)] == previous
        previous = prompt + completion
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": follow_up})
    assert messages[-2]["content"] == "ANSWER: 42"


async def test_tool_call_turn_keeps_the_token_prefix(fake: httpx.AsyncClient) -> None:
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    body = {"messages": QUESTION, "tools": tools, "return_token_ids": True}
    first = (await fake.post("/v1/chat/completions", json=body)).json()
    message = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    call = message["tool_calls"][0]
    history = [*QUESTION, message, {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
    second = (await fake.post("/v1/chat/completions", json={**body, "messages": history})).json()
    assert second["choices"][0]["message"]["content"] == "ANSWER: 42"
    before = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(before)] == before


async def test_max_tokens_and_n(fake: httpx.AsyncClient) -> None:
    data = (
        await fake.post(
            "/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 4, "n": 2}
        )
    ).json()
    assert [c["finish_reason"] for c in data["choices"]] == ["length", "length"]
    assert [c["message"]["content"] for c in data["choices"]] == ["CALC", "CALC"]
    default = (
        await fake.post("/v1/completions", json={"prompt": "x" * 40, "return_token_ids": True})
    ).json()
    assert len(default["choices"][0]["token_ids"]) == 16  # vLLM's completions default


async def test_token_prompts_and_batches(fake: httpx.AsyncClient) -> None:
    ids = encode("1 + 2")
    data = (
        await fake.post(
            "/v1/completions", json={"prompt": [ids, encode("3")], "return_token_ids": True}
        )
    ).json()
    assert [c["prompt_token_ids"] for c in data["choices"]] == [ids, encode("3")]
    assert data["choices"][0]["text"] == " echo: 1 + 2"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": QUESTION}, 404),
        ("/v1/chat/completions", {"messages": QUESTION, "top_logprobs": 2}, 400),
        ("/v1/chat/completions", {"messages": "hi"}, 400),
        ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 10**6}, 400),
        ("/v1/completions", {"prompt": [1, 2, 99999]}, 400),
        ("/v1/completions", {"prompt": 3}, 400),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400),
    ],
)
async def test_invalid_requests(
    fake: httpx.AsyncClient, path: str, body: dict[str, Any], status: int
) -> None:
    response = await fake.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and error["message"] and error["type"].endswith("Error")


async def test_tokenize_detokenize_models_health(fake: httpx.AsyncClient) -> None:
    tokens = (await fake.post("/tokenize", json={"prompt": "hi"})).json()
    assert tokens["tokens"] == encode("hi") and tokens["count"] == 2
    chat = (await fake.post("/tokenize", json={"messages": QUESTION})).json()
    direct = (
        await fake.post(
            "/v1/chat/completions", json={"messages": QUESTION, "return_token_ids": True}
        )
    ).json()
    assert chat["tokens"] == direct["prompt_token_ids"]
    text = (await fake.post("/detokenize", json={"tokens": encode("héllo")})).json()
    assert text == {"prompt": "héllo"}
    models = (await fake.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["fake-model"]
    assert (await fake.get("/health")).status_code == 200


async def test_latency_knobs() -> None:
    app = create_fake_vllm_app(ttft_s=0.05, token_delay_s=0.002)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://fake"
    ) as client:
        started = time.perf_counter()
        await client.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 10})
        assert time.perf_counter() - started >= 0.05 + 9 * 0.002
