"""An agent that hangs up mid-stream: the proxy stops relaying and logs the partial call once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
from proxy_support import Harness, proxy_settings, start_harness
from starlette.types import Message

from polar_mq.testing.asgi_stream import StreamingASGITransport
from polar_mq.testing.fake_vllm import create_fake_vllm_app

pytestmark = pytest.mark.anyio


def http_scope(path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
    raw_headers += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": raw_headers,
        "client": ("127.0.0.1", 50000),
        "server": ("proxy", 80),
    }


async def call_and_hang_up(
    harness: Harness,
    body: dict[str, Any],
    after_chunks: int | None = None,
    leaves: Callable[[list[bytes]], bool] | None = None,
) -> list[bytes]:
    """Drive the proxy app like a server whose client leaves after `after_chunks` body chunks (or
    once `leaves(received)` says so)."""
    raw = orjson.dumps(body)
    gone = asyncio.Event()
    received: list[bytes] = []
    sent_body = False

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            if gone.is_set():
                return  # like uvicorn (ASGI 2.3): sends after a disconnect are dropped
            received.append(message.get("body", b""))
            if (leaves or (lambda got: len(got) >= (after_chunks or 0)))(received):
                gone.set()
            await asyncio.sleep(0.01)  # the network is slower than the relay

    scope = http_scope("/v1/chat/completions", harness.auth, raw)
    await harness.app(scope, receive, send)
    return received


@pytest.fixture
async def paced() -> AsyncIterator[Harness]:
    """A fake that streams one token every 5 ms, streamed through to the proxy as produced."""
    fake = create_fake_vllm_app(token_delay_s=0.005)
    async for h in start_harness(proxy_settings(), fake, streaming=True):
        yield h


async def test_disconnect_mid_stream_logs_one_incomplete_call(paced: Harness) -> None:
    harness = paced
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is 12 * 34?"}],
        "stream": True,
    }
    received = await call_and_hang_up(harness, body, after_chunks=3)
    assert len(received) == 3
    assert harness.stats.streams_aborted == 1  # the upstream generation was abandoned too
    full = await harness.direct(
        "/v1/chat/completions",
        {
            **body,
            "stream": False,
            "model": "fake-model",
            "return_token_ids": True,
            "logprobs": True,
        },
    )
    full_ids = full["choices"][0]["token_ids"]
    rows = await harness.rows()
    assert len(rows) == 1
    (row,) = rows
    assert (row["complete"], row["status_code"], row["stream"]) == (False, 499, True)
    assert row["prompt_ids"] == full["prompt_token_ids"]
    ids = row["completion_ids"]
    assert 0 < len(ids) < len(full_ids) and ids == full_ids[: len(ids)]
    assert row["logprobs"] is not None and len(row["logprobs"]) == len(ids)
    assert row["finish_reason"] is None
    assert row["response"]["text"] == "CALC: 12 * 34"[: len(ids)]


async def test_events_are_relayed_as_they_arrive(paced: Harness) -> None:
    """The first event reaches the agent while the upstream is still generating; read to the end,
    the same paced stream is one complete call."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is 12 * 34?"}],
        "stream": True,
    }
    chunks: list[bytes] = []
    transport = StreamingASGITransport(paced.app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://proxy") as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=paced.auth) as response,
    ):
        async for chunk in response.aiter_raw():
            if not chunks:
                assert paced.stats.streams_finished == 0  # upstream still generating
            chunks.append(chunk)
    assert len(chunks) > 10 and chunks[-1].endswith(b"data: [DONE]\n\n")
    (row,) = await paced.rows()
    assert (row["complete"], row["status_code"], row["finish_reason"]) == (True, 200, "stop")
    assert paced.stats.streams_finished == 1 and paced.stats.streams_aborted == 0


async def test_agent_hanging_up_after_the_last_event_keeps_the_call_complete(
    paced: Harness,
) -> None:
    """Codex closes the connection as soon as `response.completed` arrives, while the proxy may
    still be reading the end of the upstream stream: the agent had the whole answer, so the call
    is complete, not a 499."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is 12 * 34?"}],
        "stream": True,
    }
    # the agent leaves on the last event, while the relay is still inside that send
    received = await call_and_hang_up(paced, body, leaves=lambda got: b"[DONE]" in got[-1])
    assert received[-1].endswith(b"data: [DONE]\n\n")
    (row,) = await paced.rows()
    assert (row["complete"], row["status_code"], row["finish_reason"]) == (True, 200, "stop")


@pytest.fixture
async def slow() -> AsyncIterator[Harness]:
    """A fake that thinks for 2 s before it answers (a long generation)."""
    fake = create_fake_vllm_app(ttft_s=2.0)
    async for h in start_harness(proxy_settings(), fake, streaming=True):
        yield h


async def test_client_leaving_a_non_streaming_call_aborts_the_generation(slow: Harness) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a long story."}]}
    raw = orjson.dumps(body)
    sent_body = False
    statuses: list[int] = []

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(0.2)  # the agent's own timeout fires
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = http_scope("/v1/chat/completions", slow.auth, raw)
    started = asyncio.get_running_loop().time()
    await slow.app(scope, receive, send)
    took = asyncio.get_running_loop().time() - started
    assert took < 1.5, "the proxy must not wait for an answer nobody will read"
    assert slow.stats.generations_cancelled == 1  # the upstream generation was abandoned
    rows = await slow.rows()
    assert len(rows) == 1
    (row,) = rows
    assert (row["complete"], row["status_code"], row["stream"]) == (False, 499, False)
    assert row["completion_ids"] is None
    assert statuses == [499]
