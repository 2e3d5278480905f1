"""Golden tests: real vLLM 0.32 responses (recorded on CPU with SmolLM2) through our capture code.

The recorded bytes are fed through the same functions the proxy runs (extraction, the SSE relay
split at awkward places, and the whole proxy with a transport that replays the recording); the
capture must equal the ids and logprobs in the recording exactly.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.proxy.engines.vllm import (
    CHAT,
    COMPLETIONS,
    StreamCapture,
    View,
    extract_response,
    strip,
)
from polar_mq.proxy.sse import SseRelay

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu"

CHAT_IDS = [33, 39, 1232, 216, 34, 37, 446, 216, 35, 34, 30, 2]
CHAT_PROMPT_HEAD = [1, 9690, 198, 2683, 359, 253]
CHAT_STREAM_IDS = [33, 39, 1232, 216, 34, 37]
COMPLETION_PROMPT = [1780, 314, 216, 33, 39, 1232, 216, 34, 37, 47, 378, 2988, 314]


def load_json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def stream_events(name: str) -> list[Any]:
    """The JSON payloads of a recorded stream (`[DONE]` as the string)."""
    raw = (FIXTURES / name).read_bytes()
    out: list[Any] = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: "):
            payload = event[6:]
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


def pieces(raw: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(raw), size):
        yield raw[start : start + size]


def everything(api_type: str) -> View:
    return View(api_type, "smollm2-135m", True, True, True, True)


def nothing(api_type: str) -> View:
    return View(api_type, "agent-model", False, False, False, False)


def test_chat_response_capture_equals_recording() -> None:
    data = load_json("vllm_chat_response.json")
    capture = extract_response(CHAT, data)
    content = data["choices"][0]["logprobs"]["content"]
    assert capture.completion_ids == CHAT_IDS
    assert capture.prompt_ids == data["prompt_token_ids"]
    assert capture.prompt_ids is not None and capture.prompt_ids[:6] == CHAT_PROMPT_HEAD
    assert len(capture.prompt_ids) == 46
    assert capture.logprobs == [entry["logprob"] for entry in content]
    assert capture.logprobs is not None and capture.logprobs[0] == -0.9188852906227112
    assert capture.finish_reason == "stop"


def test_completions_response_capture_equals_recording() -> None:
    data = load_json("vllm_completions_response.json")
    capture = extract_response(COMPLETIONS, data)
    assert capture.prompt_ids == COMPLETION_PROMPT
    assert capture.completion_ids == [216, 35, 34, 30, 2]
    assert capture.logprobs == data["choices"][0]["logprobs"]["token_logprobs"]
    assert capture.finish_reason == "stop"


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_chat_stream_capture_equals_recording(size: int) -> None:
    raw = (FIXTURES / "vllm_chat_stream.txt").read_bytes()
    capture = StreamCapture(CHAT)
    relay = SseRelay(capture.feed)
    out = b"".join(relay.feed(piece) for piece in pieces(raw, size)) + relay.flush()
    events = stream_events("vllm_chat_stream.txt")
    assert relay.done
    result = capture.result()
    assert result.prompt_ids == events[0]["prompt_token_ids"]
    assert result.completion_ids == CHAT_STREAM_IDS
    expected = [e["choices"][0]["logprobs"]["content"][0]["logprob"] for e in events[1:7]]
    assert result.logprobs == expected
    assert result.finish_reason == "length"
    assert capture.summary() == {
        "text": "17 + 25",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 46, "total_tokens": 52, "completion_tokens": 6},
    }
    # Nothing stripped by the capture alone: the relayed events are the recorded ones.
    assert [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e[6:] not in (b"", b"[DONE]")] == [
        e for e in events if e != "[DONE]"
    ]


@pytest.mark.parametrize("size", [1, 13, 100_000])
def test_completions_stream_capture_equals_recording(size: int) -> None:
    raw = (FIXTURES / "vllm_completions_stream.txt").read_bytes()
    capture = StreamCapture(COMPLETIONS)
    relay = SseRelay(capture.feed)
    for piece in pieces(raw, size):
        relay.feed(piece)
    relay.flush()
    events = stream_events("vllm_completions_stream.txt")
    result = capture.result()
    assert result.prompt_ids == COMPLETION_PROMPT
    assert result.completion_ids == [216, 35, 34]
    assert result.logprobs == [e["choices"][0]["logprobs"]["token_logprobs"][0] for e in events[:3]]
    assert result.finish_reason == "length"
    assert capture.summary()["text"] == " 32"


@pytest.mark.parametrize(
    ("name", "api_type"),
    [
        ("vllm_chat_stream.txt", CHAT),
        ("vllm_completions_stream.txt", COMPLETIONS),
    ],
)
def test_stream_strip_removes_token_fields(name: str, api_type: str) -> None:
    relay = SseRelay(lambda chunk: strip(chunk, nothing(api_type), copy_choices=False))
    out = relay.feed((FIXTURES / name).read_bytes()) + relay.flush()
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e[6:] not in (b"", b"[DONE]")]
    assert out.endswith(b"data: [DONE]\n\n")
    for event in events:
        assert "prompt_token_ids" not in event and "prompt_text" not in event
        assert event["model"] == "agent-model"
        for choice in event["choices"]:
            assert "token_ids" not in choice and "prompt_token_ids" not in choice
            assert choice["logprobs"] is None


def test_strip_keeps_everything_the_agent_asked_for() -> None:
    data = load_json("vllm_chat_response.json")
    kept = dict(data)
    strip(kept, everything(CHAT))
    assert kept == data


def replay(files: dict[str, str]) -> httpx.MockTransport:
    """An upstream that answers each path with the recorded vLLM bytes."""

    def handler(request: httpx.Request) -> httpx.Response:
        stream = orjson.loads(request.content).get("stream")
        name = files[request.url.path + (":stream" if stream else "")]
        ctype = "text/event-stream" if stream else "application/json"
        return httpx.Response(
            200, content=(FIXTURES / name).read_bytes(), headers={"content-type": ctype}
        )

    return httpx.MockTransport(handler)


@pytest.mark.anyio
async def test_proxy_stores_the_recorded_capture() -> None:
    """The whole proxy, with real vLLM bytes as the upstream: the rows hold the recorded ids."""
    transport = replay(
        {
            "/v1/chat/completions": "vllm_chat_response.json",
            "/v1/chat/completions:stream": "vllm_chat_stream.txt",
            "/v1/completions": "vllm_completions_response.json",
            "/v1/completions:stream": "vllm_completions_stream.txt",
        }
    )
    sink = MemoryCallSink()
    app = create_proxy_app(
        proxy_settings(served_model="smollm2-135m"), upstream_transport=transport, sink=sink
    )
    token = issue_rollout_token(SECRET, uuid.uuid4(), 60)
    chat: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
    }
    completion: dict[str, Any] = {"model": "m", "prompt": "What is 17 + 25?"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as client,
    ):
        for path, body in [("/v1/chat/completions", chat), ("/v1/completions", completion)]:
            for stream in (False, True):
                response = await client.post(
                    path, json={**body, "stream": stream}, headers={"x-api-key": token}
                )
                assert response.status_code == 200
                assert b"token_ids" not in response.content
    chat_row, chat_stream_row, completion_row, completion_stream_row = sink.rows
    chat_data = load_json("vllm_chat_response.json")
    assert chat_row["prompt_ids"] == chat_data["prompt_token_ids"]
    assert chat_row["completion_ids"] == CHAT_IDS
    assert chat_row["logprobs"] == [
        e["logprob"] for e in chat_data["choices"][0]["logprobs"]["content"]
    ]
    assert chat_row["response"] == chat_data
    assert chat_stream_row["completion_ids"] == CHAT_STREAM_IDS
    assert chat_stream_row["prompt_ids"] == chat_data["prompt_token_ids"]
    assert (chat_stream_row["complete"], chat_stream_row["finish_reason"]) == (True, "length")
    completion_data = load_json("vllm_completions_response.json")
    assert completion_row["prompt_ids"] == COMPLETION_PROMPT
    assert completion_row["completion_ids"] == [216, 35, 34, 30, 2]
    assert completion_row["logprobs"] == completion_data["choices"][0]["logprobs"]["token_logprobs"]
    assert completion_stream_row["completion_ids"] == [216, 35, 34]
    assert completion_stream_row["prompt_ids"] == COMPLETION_PROMPT
    assert [r["seq"] for r in sink.rows] == [0, 1, 2, 3]
