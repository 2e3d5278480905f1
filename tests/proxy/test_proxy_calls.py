"""Proxied calls against the fake vLLM: what the agent sees and what the proxy stores."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from typing import Any

import orjson
import pytest
from proxy_support import UPSTREAM, Harness, proxy_settings, start_harness

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
QUESTION = [{"role": "user", "content": "What is 17 + 25?"}]
VOLATILE = ("id", "created")


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def without(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in keys}


def upstream_view(body: dict[str, Any], api_type: str) -> dict[str, Any]:
    """The request the proxy sends upstream for `body` (token ids and logprobs on)."""
    logprobs: Any = True if api_type == "chat" else max(body.get("logprobs") or 0, 0)
    return {**body, "model": "fake-model", "return_token_ids": True, "logprobs": logprobs}


async def test_chat_capture_equals_direct_upstream_call(harness: Harness) -> None:
    body = {"model": "my-policy", "messages": QUESTION, "max_tokens": 64}
    response = await harness.post(CHAT, body)
    assert response.status_code == 200
    direct = await harness.direct(CHAT, upstream_view(body, "chat"))
    (row,) = await harness.rows()
    choice = direct["choices"][0]
    assert row["prompt_ids"] == direct["prompt_token_ids"]
    assert row["completion_ids"] == choice["token_ids"]
    assert row["completion_ids"][-1] == 2  # <|im_end|>
    assert row["logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert row["finish_reason"] == "stop"
    assert without(row["response"], *VOLATILE) == without(direct, *VOLATILE)
    assert row["request"] == body
    assert (row["api_type"], row["stream"], row["complete"]) == ("chat", False, True)
    assert (row["status_code"], row["policy_version"], row["seq"]) == (200, 0, 0)
    assert (row["rollout_id"], row["backend"], row["model"]) == (
        harness.rollout_id,
        UPSTREAM,
        "fake-model",
    )
    assert row["latency_ms"] > 0 and row["ttft_ms"] is None


async def test_chat_stream_capture_equals_direct_upstream_call(harness: Harness) -> None:
    body = {"model": "my-policy", "messages": QUESTION, "stream": True}
    response = await harness.post(CHAT, body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    direct = await harness.direct(CHAT, {**upstream_view(body, "chat"), "stream": False})
    (row,) = await harness.rows()
    choice = direct["choices"][0]
    assert row["prompt_ids"] == direct["prompt_token_ids"]
    assert row["completion_ids"] == choice["token_ids"]
    assert row["logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert (row["stream"], row["complete"], row["finish_reason"]) == (True, True, "stop")
    assert row["response"] == {
        "text": "CALC: 17 + 25",
        "finish_reason": "stop",
        "usage": {
            "prompt_tokens": len(row["prompt_ids"]),
            "completion_tokens": len(row["completion_ids"]),
            "total_tokens": len(row["prompt_ids"]) + len(row["completion_ids"]),
        },
    }
    assert row["ttft_ms"] is not None and 0 < row["ttft_ms"] <= row["latency_ms"]
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in sse_events(response.content)
    )
    assert text == "CALC: 17 + 25"


@pytest.mark.parametrize("prompt", ["Numbers: 1, 2, 3", [78, 120, 112, 101]])
async def test_completions_capture_equals_direct_upstream_call(
    harness: Harness, prompt: str | list[int]
) -> None:
    body = {"model": "my-policy", "prompt": prompt, "max_tokens": 40}
    response = await harness.post(COMPLETIONS, body)
    assert response.status_code == 200
    direct = await harness.direct(COMPLETIONS, upstream_view(body, "completions"))
    (row,) = await harness.rows()
    choice = direct["choices"][0]
    assert row["prompt_ids"] == choice["prompt_token_ids"]
    if isinstance(prompt, list):
        assert row["prompt_ids"] == prompt
    assert row["completion_ids"] == choice["token_ids"]
    assert row["logprobs"] == choice["logprobs"]["token_logprobs"]
    assert (row["api_type"], row["finish_reason"]) == ("completions", "stop")
    assert response.json()["choices"][0]["text"] == choice["text"]


async def test_completions_stream_capture_and_length_finish(harness: Harness) -> None:
    body = {"model": "my-policy", "prompt": "Say something long", "stream": True, "max_tokens": 5}
    response = await harness.post(COMPLETIONS, body)
    events = sse_events(response.content)
    direct = await harness.direct(
        COMPLETIONS, {**upstream_view(body, "completions"), "stream": False}
    )
    (row,) = await harness.rows()
    choice = direct["choices"][0]
    assert row["prompt_ids"] == choice["prompt_token_ids"]
    assert row["completion_ids"] == choice["token_ids"] and len(row["completion_ids"]) == 5
    assert row["logprobs"] == choice["logprobs"]["token_logprobs"]
    assert (row["finish_reason"], row["complete"]) == ("length", True)
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_unrequested_fields_are_stripped(harness: Harness, path: str, stream: bool) -> None:
    """The agent sees what vLLM would show it for its own request: no ids, no logprobs."""
    body: dict[str, Any] = {"model": "my-policy", "stream": stream}
    body.update({"messages": QUESTION} if path == CHAT else {"prompt": "2 + 2 ="})
    response = await harness.post(path, body)
    assert response.status_code == 200
    assert b"token_ids" not in response.content
    assert b"prompt_text" not in response.content
    assert b"kv_transfer_params" not in response.content
    assert b"prompt_logprobs" not in response.content
    chunks = sse_events(response.content) if stream else [response.json()]
    for chunk in chunks:
        assert chunk["model"] == "my-policy"
        assert all(c["logprobs"] is None for c in chunk["choices"])
    if not stream:
        direct = await harness.direct(path, {**body, "model": "fake-model"})
        direct["choices"] = [without(c, "prompt_logprobs") for c in direct["choices"]]
        stripped = ("prompt_logprobs", "kv_transfer_params", *VOLATILE)
        assert without(response.json(), *stripped) == without(
            {**direct, "model": "my-policy"}, *stripped
        )
    (row,) = await harness.rows()
    assert row["completion_ids"] and row["logprobs"] and row["prompt_ids"]


@pytest.mark.parametrize("stream", [False, True])
async def test_requested_fields_are_kept(harness: Harness, stream: bool) -> None:
    body = {
        "model": "my-policy",
        "messages": QUESTION,
        "stream": stream,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    response = await harness.post(CHAT, body)
    (row,) = await harness.rows()
    if stream:
        events = sse_events(response.content)
        assert events[0]["prompt_token_ids"] == row["prompt_ids"]
        ids = [i for e in events for c in e["choices"] for i in c.get("token_ids", [])]
        entries = [
            x
            for e in events
            for c in e["choices"]
            if c["logprobs"]
            for x in c["logprobs"]["content"]
        ]
    else:
        data = response.json()
        assert data["prompt_token_ids"] == row["prompt_ids"]
        ids = data["choices"][0]["token_ids"]
        entries = data["choices"][0]["logprobs"]["content"]
    assert ids == row["completion_ids"]
    assert [e["logprob"] for e in entries] == row["logprobs"]
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    sent = harness.stats.last_request
    assert sent is not None and sent["top_logprobs"] == 2


async def test_completions_logprobs_kept_when_asked(harness: Harness) -> None:
    response = await harness.post(COMPLETIONS, {"model": "x", "prompt": "1 + 1", "logprobs": 2})
    choice = response.json()["choices"][0]
    assert len(choice["logprobs"]["top_logprobs"][0]) == 2
    assert "token_ids" not in choice
    assert harness.stats.last_request is not None
    assert harness.stats.last_request["logprobs"] == 2


async def test_request_rewrite_sent_upstream(harness: Harness) -> None:
    await harness.post(CHAT, {"model": "gpt-4o", "messages": QUESTION, "logprobs": False})
    sent = harness.stats.last_request
    assert sent is not None
    assert sent["model"] == "fake-model"
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    await harness.post(COMPLETIONS, {"model": "gpt-4o", "prompt": "hi"})
    sent = harness.stats.last_request
    assert sent is not None and sent["logprobs"] == 0 and sent["return_token_ids"] is True
    (chat_row, _) = await harness.rows()
    assert chat_row["request"]["model"] == "gpt-4o"  # the agent's own request is stored


async def test_model_passes_unchanged_without_served_model() -> None:
    async for h in start_harness(proxy_settings(served_model=None)):
        ok = await h.post(CHAT, {"model": "fake-model", "messages": QUESTION})
        assert ok.status_code == 200 and ok.json()["model"] == "fake-model"
        unknown = await h.post(CHAT, {"model": "gpt-4o", "messages": QUESTION})
        assert unknown.status_code == 404  # vLLM's answer, passed through
        assert unknown.json()["error"]["type"] == "NotFoundError"
        ok_row, bad_row = await h.rows()
        assert (ok_row["model"], ok_row["complete"]) == ("fake-model", True)
        assert (bad_row["status_code"], bad_row["complete"]) == (404, False)
        assert bad_row["response"]["error"]["code"] == 404


async def test_upstream_error_is_passed_through(harness: Harness) -> None:
    response = await harness.post(CHAT, {"model": "m", "messages": []})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"
    (row,) = await harness.rows()
    assert (row["status_code"], row["complete"], row["completion_ids"]) == (400, False, None)


async def test_seq_counts_per_rollout(harness: Harness) -> None:
    other = dataclasses.replace(harness, rollout_id=uuid.uuid4())
    for h in (harness, harness, other, harness, other):
        assert (await h.post(COMPLETIONS, {"model": "m", "prompt": "x"})).status_code == 200
    rows = await harness.rows()
    seqs = [(r["rollout_id"] == harness.rollout_id, r["seq"]) for r in rows]
    assert seqs == [(True, 0), (True, 1), (False, 0), (True, 2), (False, 1)]


async def test_models_lists_the_served_model(harness: Harness) -> None:
    response = await harness.client.get("/v1/models", headers=harness.auth)
    assert [m["id"] for m in response.json()["data"]] == ["fake-model"]
    assert harness.stats.paths["/v1/models"] == 0


async def test_models_asks_upstream_without_served_model() -> None:
    async for h in start_harness(proxy_settings(served_model=None)):
        response = await h.client.get(f"/r/{h.token}/v1/models")
        assert [m["id"] for m in response.json()["data"]] == ["fake-model"]


async def test_healthz(harness: Harness) -> None:
    response = await harness.client.get("/healthz")
    body = response.json()
    assert response.status_code == 200 and body.pop("status") == "ok"
    keys = {"started_at", "worker", "pid", "backends", "backends_usable"}
    assert body.keys() == keys and 0 < body["started_at"] <= time.time()
    assert body["worker"] == 0 and body["pid"] == os.getpid()  # a single-process proxy
