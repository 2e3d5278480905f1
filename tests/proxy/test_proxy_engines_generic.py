"""The generic engine: nothing added to the request, ids re-tokenized afterwards, marked so.

The upstream is the fake vLLM used as "any OpenAI-compatible server with /tokenize". Its byte
tokenizer round-trips text exactly, so the re-tokenized prompt must equal the real prompt ids and
the re-tokenized completion the real ids minus the end-of-turn token the text does not contain:
exactly the fidelity loss the `retokenized` mark warns about.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from proxy_support import Harness, proxy_settings, start_harness
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route, request_response

from polar_mq.proxy import MemoryCallSink
from polar_mq.proxy.backends import Backend
from polar_mq.proxy.engines.base import CHAT as CHAT_API
from polar_mq.proxy.engines.retokenize import TOKENIZE_ATTEMPTS, RetokenizingSink
from polar_mq.testing.fake_vllm import create_fake_vllm_app

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]
IM_END = 2


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in start_harness(proxy_settings(upstream_engine="generic")):
        yield h


async def stored(harness: Harness) -> list[dict[str, Any]]:
    """Rows once re-tokenized: the app's sink (the wrapper) waits for rows in flight."""
    await harness.app.state.proxy.sink.flush()
    return harness.sink.rows


async def truth(harness: Harness, path: str, body: dict[str, Any]) -> tuple[list[int], list[int]]:
    direct = await harness.direct(path, {**body, "model": "fake-model", "return_token_ids": True})
    choice = direct["choices"][0]
    prompt = direct["prompt_token_ids"] if path == CHAT else choice["prompt_token_ids"]
    return prompt, choice["token_ids"]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_is_forwarded_untouched_and_retokenized(harness: Harness, stream: bool) -> None:
    body = {"model": "my-policy", "messages": QUESTION, "stream": stream}
    response = await harness.post(CHAT, body)
    assert response.status_code == 200
    assert harness.stats.last_request == {**body, "model": "fake-model"}  # nothing added
    (row,) = await stored(harness)
    prompt, completion = await truth(harness, CHAT, {"messages": QUESTION})
    assert completion[-1] == IM_END
    assert row["prompt_ids"] == prompt
    assert row["completion_ids"] == completion[:-1]  # the text has no <|im_end|>
    assert row["response"]["fidelity"] == "retokenized"
    assert row["logprobs"] is None and row["finish_reason"] == "stop" and row["complete"]
    if not stream:
        assert "fidelity" not in response.json()  # the mark is ours, stored only
        assert response.json()["model"] == "my-policy"


async def test_logprobs_kept_only_when_they_match_the_retokenized_ids(harness: Harness) -> None:
    cut = {"model": "my-policy", "messages": QUESTION, "logprobs": True, "max_tokens": 4}
    whole = {"model": "my-policy", "messages": QUESTION, "logprobs": True}
    assert (await harness.post(CHAT, cut)).status_code == 200
    answer = (await harness.post(CHAT, whole)).json()
    cut_row, whole_row = await stored(harness)
    assert cut_row["finish_reason"] == "length" and len(cut_row["completion_ids"]) == 4
    assert cut_row["logprobs"] is not None and len(cut_row["logprobs"]) == 4
    assert len(answer["choices"][0]["logprobs"]["content"]) == len(whole_row["completion_ids"]) + 1
    assert whole_row["logprobs"] is None  # 1 more logprob (for <|im_end|>) than ids


async def test_token_id_prompt_is_taken_as_is(harness: Harness) -> None:
    body = {"model": "my-policy", "prompt": [70, 71, 72], "max_tokens": 6}
    assert (await harness.post(COMPLETIONS, body)).status_code == 200
    (row,) = await stored(harness)
    prompt, completion = await truth(
        harness, COMPLETIONS, {"prompt": [70, 71, 72], "max_tokens": 6}
    )
    assert row["prompt_ids"] == prompt == [70, 71, 72]
    assert row["completion_ids"] == completion and row["response"]["fidelity"] == "retokenized"


async def test_without_a_tokenize_endpoint_the_call_is_stored_marked_missing() -> None:
    fake = create_fake_vllm_app()
    fake.router.routes = [
        r for r in fake.router.routes if not (isinstance(r, Route) and r.path == "/tokenize")
    ]
    async for harness in start_harness(proxy_settings(upstream_engine="generic"), fake):
        response = await harness.post(CHAT, {"model": "my-policy", "messages": QUESTION})
        assert response.status_code == 200
        (row,) = await stored(harness)
        assert (row["prompt_ids"], row["completion_ids"]) == (None, None)
        assert row["response"]["fidelity"] == "missing" and row["complete"]
        assert harness.app.state.proxy.sink.stats()["retokenize_failed"] == 1


async def test_upstream_errors_are_stored_without_tokenizing(harness: Harness) -> None:
    response = await harness.post(CHAT, {"model": "my-policy", "messages": []})
    assert response.status_code == 400
    (row,) = await stored(harness)
    assert row["status_code"] == 400 and "fidelity" not in row["response"]
    assert harness.stats.paths["/tokenize"] == 0


def _tokenize_dropping(fake: Starlette, drops: int) -> dict[str, int]:
    """`/tokenize` whose first `drops` calls fail in transport (a connection closed under the
    client, as a server's keep-alive timeout does), then answer as before."""
    (route,) = [r for r in fake.router.routes if isinstance(r, Route) and r.path == "/tokenize"]
    answer = route.endpoint
    seen = {"calls": 0}

    async def flaky(request: Request) -> Any:
        seen["calls"] += 1
        if seen["calls"] <= drops:
            raise httpx.ReadError("connection closed by the server")
        return await answer(request)

    route.app = request_response(flaky)
    return seen


@pytest.mark.parametrize("drops", [1, 2])
async def test_a_tokenize_call_dropped_in_transport_is_tried_again(drops: int) -> None:
    fake = create_fake_vllm_app()
    seen = _tokenize_dropping(fake, drops)
    async for harness in start_harness(proxy_settings(upstream_engine="generic"), fake):
        response = await harness.post(CHAT, {"model": "my-policy", "messages": QUESTION})
        assert response.status_code == 200
        (row,) = await stored(harness)
        assert row["response"]["fidelity"] == "retokenized" and row["prompt_ids"]
        assert harness.app.state.proxy.sink.stats()["retokenize_failed"] == 0
        assert seen["calls"] == 2 + drops  # the prompt and the completion, and the retries


async def test_a_backend_that_keeps_dropping_tokenize_leaves_the_ids_missing() -> None:
    fake = create_fake_vllm_app()
    seen = _tokenize_dropping(fake, 1000)
    async for harness in start_harness(proxy_settings(upstream_engine="generic"), fake):
        response = await harness.post(CHAT, {"model": "my-policy", "messages": QUESTION})
        assert response.status_code == 200
        (row,) = await stored(harness)
        assert row["response"]["fidelity"] == "missing"
        # bounded: the first lookup to give up stops the other, and nothing goes on after the
        # row is stored (a lookup left running retried once more under load: 5 calls, not 6)
        assert TOKENIZE_ATTEMPTS <= seen["calls"] <= 2 * TOKENIZE_ATTEMPTS
        calls_when_stored = seen["calls"]
        await asyncio.sleep(0.5)  # longer than every backoff left (0.05 s, then 0.1 s)
        assert seen["calls"] == calls_when_stored


async def test_an_unexpected_error_while_retokenizing_still_stores_the_call() -> None:
    """A bug of ours (here: the backend lookup raising) costs the call its ids, never its row."""

    def broken(name: str) -> Backend:
        raise RuntimeError(f"no backend named {name}")

    inner = MemoryCallSink()
    sink = RetokenizingSink(inner, broken)
    sink.submit(
        {
            "id": "call-1",
            "api_type": CHAT_API,
            "backend": "b0",
            "status_code": 200,
            "stream": False,
            "request": {"messages": QUESTION},
            "response": {"choices": [{"index": 0, "message": {"content": "42"}}]},
            "completion_ids": None,
            "logprobs": None,
        }
    )
    await sink.flush()
    (row,) = inner.rows
    assert row["response"]["fidelity"] == "missing" and row["completion_ids"] is None
    assert sink.stats()["retokenize_failed"] == 1


async def test_a_proxy_stopping_waits_for_the_retokenizing_before_closing_its_backends() -> None:
    """Shutting down closed the backends' clients before the sink's drain: a /tokenize still to
    be sent (here a retry after a dropped connection) met a closed client and the call lost its
    ids (`missing`; seen with real vLLM on a slow host, where /tokenize outlasted the rest of the
    shutdown). Answer-first only: with durable answers (the default) the answer itself waits for
    the re-tokenizing, as the next test shows."""
    fake = create_fake_vllm_app()
    (route,) = [r for r in fake.router.routes if isinstance(r, Route) and r.path == "/tokenize"]
    answer = route.endpoint
    seen = {"calls": 0}

    async def slow_then_dropped_once(request: Request) -> Any:
        seen["calls"] += 1
        if seen["calls"] == 1:
            await asyncio.sleep(0.3)  # the proxy is stopping meanwhile
            raise httpx.ReadError("connection closed by the server")
        return await answer(request)

    route.app = request_response(slow_then_dropped_once)
    settings = proxy_settings(upstream_engine="generic", proxy_durable_answers=False)
    async for harness in start_harness(settings, fake):
        response = await harness.post(CHAT, {"model": "my-policy", "messages": QUESTION})
        assert response.status_code == 200
        sink = harness.sink
        assert sink.rows == []  # still re-tokenizing when the proxy stops
    (row,) = sink.rows
    assert row["response"]["fidelity"] == "retokenized" and row["prompt_ids"]
    assert seen["calls"] == 3  # the prompt, the completion and the retry


async def test_a_durable_answer_waits_for_the_retokenized_row() -> None:
    """With durable answers (the default) an answer leaves only once its row is stored, and for a
    generic engine that row is the re-tokenized one: the agent never holds an answer whose ids
    are still being rebuilt when the proxy dies."""
    async for harness in start_harness(
        proxy_settings(upstream_engine="generic"), create_fake_vllm_app()
    ):
        response = await harness.post(CHAT, {"model": "my-policy", "messages": QUESTION})
        assert response.status_code == 200
        (row,) = harness.sink.rows  # stored before the answer came back
        assert row["response"]["fidelity"] == "retokenized" and row["prompt_ids"]
