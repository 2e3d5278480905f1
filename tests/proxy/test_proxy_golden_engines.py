"""Golden: vLLM-shaped and SGLang-shaped answers with the same tokens give the same stored call.

Both fakes run the same policy and tokenizer, so one request yields the same tokens from each;
only the wire format differs (vLLM: `return_token_ids` fields; SGLang: `sglext`, its own finish
chunk and field set). Through the proxy configured for each engine, the stored ids, logprobs and
finish reason must be identical, equal to the fake's ground truth, and what the agent sees must
be the same OpenAI answer with none of the fields the proxy added.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from proxy_support import Harness, proxy_settings, start_harness

from polar_mq.testing.fake_sglang import create_fake_sglang_app
from polar_mq.testing.fake_vllm import create_fake_vllm_app

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
QUESTION = [{"role": "user", "content": "What is (17 + 25) * 3?"}]
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, {"messages": QUESTION}),
    "chat+logprobs": (CHAT, {"messages": QUESTION, "logprobs": True, "top_logprobs": 2}),
    "chat+tools": (CHAT, {"messages": QUESTION, "tools": TOOLS}),
    "chat+length": (CHAT, {"messages": QUESTION, "max_tokens": 5}),
    "completions": (COMPLETIONS, {"prompt": "Q: 2+2\nA: 4\nQ: 3+3", "max_tokens": 12}),
    "completions+logprobs": (COMPLETIONS, {"prompt": [70, 71, 72], "logprobs": 1}),
}
ADDED_FIELDS = (b"token_ids", b"sglext", b"prompt_text", b"meta_info")
CAPTURED = ("prompt_ids", "completion_ids", "logprobs", "finish_reason", "complete", "status_code")


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, Harness]]:
    """The proxy in front of each fake, configured for that engine."""
    async for vllm in start_harness(proxy_settings(upstream_engine="vllm"), create_fake_vllm_app()):
        sglang_fake = create_fake_sglang_app()
        async for sglang in start_harness(proxy_settings(upstream_engine="sglang"), sglang_fake):
            yield {"vllm": vllm, "sglang": sglang}


def standard(data: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI fields of a non-streaming answer (engine-specific extras left out)."""
    choices = []
    for choice in data["choices"]:
        out = {k: choice.get(k) for k in ("index", "logprobs", "finish_reason", "text")}
        message = choice.get("message")
        if message is not None:
            out["message"] = {
                "role": message["role"],
                "content": message.get("content") or "",  # SGLang: "", vLLM: null with tools
                "tool_calls": [
                    {"type": c["type"], "function": c["function"]}
                    for c in message.get("tool_calls") or []
                ],
            }
        choices.append(out)
    usage = {k: data["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"object": data["object"], "model": data["model"], "choices": choices, "usage": usage}


def assembled(raw: bytes) -> dict[str, Any]:
    """What an agent makes of a streamed answer: text, tool calls, logprobs, finish reason."""
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"[DONE]"
    text, names, logprobs, finish = [], [], [], None
    for event in events[:-1]:
        chunk = orjson.loads(event)
        assert chunk.get("model", "my-policy") == "my-policy"
        for choice in chunk["choices"]:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or choice.get("text") or "")
            names += [c["function"]["name"] for c in delta.get("tool_calls") or []]
            lp = choice.get("logprobs") or {}
            logprobs += [e["logprob"] for e in lp.get("content") or []]
            logprobs += lp.get("token_logprobs") or []
            finish = choice.get("finish_reason") or finish
    return {"text": "".join(text), "tools": names, "logprobs": logprobs, "finish": finish}


async def ground_truth(harness: Harness, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The fake vLLM asked directly for everything: the tokens both engines generate."""
    logprobs: Any = True if path == CHAT else 0
    ask = {**body, "model": "fake-model", "return_token_ids": True, "logprobs": logprobs}
    direct = await harness.direct(path, ask)
    choice = direct["choices"][0]
    if path == CHAT:
        prompt = direct["prompt_token_ids"]
        values = [e["logprob"] for e in choice["logprobs"]["content"]]
    else:
        prompt = choice["prompt_token_ids"]
        values = choice["logprobs"]["token_logprobs"]
    return {"prompt_ids": prompt, "completion_ids": choice["token_ids"], "logprobs": values}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", list(CASES))
async def test_vllm_and_sglang_store_identical_calls(
    engines: dict[str, Harness], case: str, stream: bool
) -> None:
    path, extra = CASES[case]
    body = {"model": "my-policy", **extra, "stream": stream}
    seen: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for name, harness in engines.items():
        response = await harness.post(path, body)
        assert response.status_code == 200, response.text
        assert not any(field in response.content for field in ADDED_FIELDS)
        seen[name] = assembled(response.content) if stream else standard(response.json())
        (rows[name],) = await harness.rows()
    vllm_row, sglang_row = rows["vllm"], rows["sglang"]
    assert {k: sglang_row[k] for k in CAPTURED} == {k: vllm_row[k] for k in CAPTURED}
    assert seen["sglang"] == seen["vllm"]
    truth = await ground_truth(engines["vllm"], path, extra)
    assert vllm_row["prompt_ids"] == truth["prompt_ids"]
    assert vllm_row["completion_ids"] == truth["completion_ids"]
    assert vllm_row["logprobs"] == truth["logprobs"]
    assert vllm_row["complete"] is True and vllm_row["finish_reason"] in (
        "stop",
        "length",
        "tool_calls",
    )
    if stream:
        assert sglang_row["response"]["text"] == vllm_row["response"]["text"]


async def test_what_reaches_each_engine(engines: dict[str, Harness]) -> None:
    """vLLM is asked with `return_token_ids`; SGLang chat with its `sglext` flags (it refuses
    `return_token_ids` on streamed chat) and SGLang completions with `return_token_ids`."""
    chat = {"model": "my-policy", "messages": QUESTION, "stream": True}
    for name, harness in engines.items():
        assert (await harness.post(CHAT, chat)).status_code == 200
        sent = harness.stats.last_request
        assert sent is not None and sent["model"] == "fake-model" and sent["logprobs"] is True
        if name == "vllm":
            assert sent["return_token_ids"] is True and "return_output_ids_in_sglext" not in sent
        else:
            assert "return_token_ids" not in sent
            assert sent["return_input_ids_in_sglext"] is sent["return_output_ids_in_sglext"] is True
    completion = {"model": "my-policy", "prompt": "hi", "max_tokens": 3}
    assert (await engines["sglang"].post(COMPLETIONS, completion)).status_code == 200
    sent = engines["sglang"].stats.last_request
    assert sent is not None and sent["return_token_ids"] is True and sent["logprobs"] == 0
