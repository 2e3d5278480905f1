"""The job's sampling policy, carried by the rollout token, enforced on every API family.

The agent asks for temperature 0 and 32,000 tokens (aider, Claude Code); the job says temperature
0.9 (override) and at most 64 tokens (clamp): the engine gets the job's values, the stored call
shows both what the agent sent (`request`) and what the engine used (`engine_request`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from family_support import parse_sse
from proxy_support import SECRET, Harness, proxy_settings, start_harness

from polar_mq.capability.sampling import SamplingPolicy, sampling_policy
from polar_mq.capability.tokens import issue_rollout_token

pytestmark = pytest.mark.anyio

JOB_SAMPLING = {
    "temperature": 0.9,
    "max_tokens": 64,
    "top_k": 20,
    "enforce": {"temperature": "override", "max_tokens": "clamp", "top_k": "off"},
}
MESSAGES = [{"role": "user", "content": "What is 17 + 25?"}]
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture
async def streaming_harness() -> AsyncIterator[Harness]:
    async for h in start_harness(proxy_settings(), streaming=True):
        yield h


def token(h: Harness, sampling: dict[str, Any] = JOB_SAMPLING) -> str:
    policy: SamplingPolicy = sampling_policy(sampling)
    return issue_rollout_token(SECRET, h.rollout_id, 600, attempt=1, sampling=policy)


async def post(
    h: Harness, path: str, body: dict[str, Any], sampling: dict[str, Any] = JOB_SAMPLING
) -> Any:
    headers = {"authorization": f"Bearer {token(h, sampling)}", **ANTHROPIC_HEADERS}
    response = await h.client.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


def sent(h: Harness) -> dict[str, Any]:
    assert h.stats.last_request is not None
    return h.stats.last_request


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_gets_the_jobs_temperature_and_token_limit(
    streaming_harness: Harness, stream: bool
) -> None:
    h = streaming_harness
    body = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 32000, "top_k": 5}
    if stream:
        body["stream"] = True
    response = await post(h, "/v1/chat/completions", body)
    if stream:
        assert parse_sse(response.text)[-1] == (None, "[DONE]")
    upstream = sent(h)
    assert (upstream["temperature"], upstream["max_tokens"], upstream["top_k"]) == (0.9, 64, 5)
    (row,) = await h.rows()
    assert row["request"] == body  # what the agent sent
    engine = row["engine_request"]
    assert (engine["temperature"], engine["max_tokens"], engine["top_k"]) == (0.9, 64, 5)
    assert engine["model"] == "fake-model" and engine["messages"] == MESSAGES
    assert row["complete"] and row["stream"] is stream and row["completion_ids"]


async def test_a_smaller_limit_is_kept_and_absent_values_are_added(harness: Harness) -> None:
    body = {"model": "m", "messages": MESSAGES, "temperature": 0.9, "max_tokens": 10}
    await post(harness, "/v1/chat/completions", body)
    assert (sent(harness)["temperature"], sent(harness)["max_tokens"]) == (0.9, 10)
    (row,) = await harness.rows()
    assert row["engine_request"] is None  # nothing changed: the request alone is stored
    await post(harness, "/v1/chat/completions", {"model": "m", "messages": MESSAGES})
    assert (sent(harness)["temperature"], sent(harness)["max_tokens"]) == (0.9, 64)


async def test_max_completion_tokens_is_clamped_too(harness: Harness) -> None:
    body = {"model": "m", "messages": MESSAGES, "max_completion_tokens": 32000}
    await post(harness, "/v1/chat/completions", body)
    assert sent(harness)["max_completion_tokens"] == 64 and "max_tokens" not in sent(harness)


async def test_off_leaves_the_agents_values_alone(harness: Harness) -> None:
    body = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 100}
    await post(harness, "/v1/chat/completions", body, {**JOB_SAMPLING, "enforce": "off"})
    assert (sent(harness)["temperature"], sent(harness)["max_tokens"]) == (0, 100)
    plain = {"authorization": f"Bearer {harness.token}"}  # a token without a policy
    await harness.client.post("/v1/chat/completions", json=body, headers=plain)
    assert (sent(harness)["temperature"], sent(harness)["max_tokens"]) == (0, 100)
    assert all(row["engine_request"] is None for row in await harness.rows())


async def test_completions_are_enforced(harness: Harness) -> None:
    body = {"model": "m", "prompt": "Hello", "temperature": 0, "max_tokens": 32000}
    await post(harness, "/v1/completions", body)
    assert (sent(harness)["temperature"], sent(harness)["max_tokens"]) == (0.9, 64)
    (row,) = await harness.rows()
    assert row["request"] == body and row["engine_request"]["max_tokens"] == 64


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages_get_the_jobs_values(
    streaming_harness: Harness, stream: bool
) -> None:
    h = streaming_harness
    body = {"model": "claude-x", "max_tokens": 32000, "temperature": 0, "messages": MESSAGES}
    if stream:
        body["stream"] = True
    response = await post(h, "/v1/messages", body)
    if stream:
        assert parse_sse(response.text)[-1][0] == "message_stop"
    assert (sent(h)["temperature"], sent(h)["max_tokens"]) == (0.9, 64)
    (row,) = await h.rows()
    assert row["request"] == body
    assert (row["engine_request"]["temperature"], row["engine_request"]["max_tokens"]) == (0.9, 64)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_max_output_tokens_is_clamped(
    streaming_harness: Harness, stream: bool
) -> None:
    h = streaming_harness
    body = {"model": "p", "input": "What is 17 + 25?", "max_output_tokens": 32000, "temperature": 0}
    if stream:
        body["stream"] = True
    response = await post(h, "/v1/responses", body)
    if stream:
        assert parse_sse(response.text)[-1][0] == "response.completed"
    assert (sent(h)["temperature"], sent(h)["max_tokens"]) == (0.9, 64)
    (row,) = await h.rows()
    assert row["request"] == body
    assert (row["engine_request"]["temperature"], row["engine_request"]["max_tokens"]) == (0.9, 64)
    small = {"model": "p", "input": "Hi", "max_output_tokens": 8, "stream": stream}
    await post(h, "/v1/responses", small)
    assert sent(h)["max_tokens"] == 8


async def test_gemini_generation_config_is_enforced(harness: Harness) -> None:
    config = {"temperature": 0, "maxOutputTokens": 32000}
    body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}], "generationConfig": config}
    await post(harness, "/v1beta/models/policy:generateContent", body)
    assert (sent(harness)["temperature"], sent(harness)["max_tokens"]) == (0.9, 64)
    (row,) = await harness.rows()
    assert row["request"] == body and row["engine_request"]["max_tokens"] == 64


EXACT_SAMPLING = {**JOB_SAMPLING, "exact": True}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_exact_job_removes_what_shapes_the_distribution(
    streaming_harness: Harness, stream: bool
) -> None:
    """A training job's learner scores softmax(logits / T): an agent's penalties, `min_p`,
    `logit_bias`, JSON mode or forced tool call would have the engine sample from (and report
    the logprobs of) another distribution. `exact` removes them; the stored call shows both."""
    h = streaming_harness
    shaping = {
        "min_p": 0.1, "logit_bias": {"42": 100}, "repetition_penalty": 1.3,
        "presence_penalty": 0.5, "frequency_penalty": 0.5, "min_tokens": 4,
        "response_format": {"type": "json_object"}, "guided_regex": "[0-9]+",
        "extra_body": {"min_p": 0.1},
    }  # fmt: skip
    body = {
        "model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
        "seed": 3, "stream": stream, **shaping,
    }  # fmt: skip
    await post(h, "/v1/chat/completions", body, EXACT_SAMPLING)
    upstream = sent(h)
    assert not set(shaping) & set(upstream), upstream
    assert (upstream["tool_choice"], upstream["seed"], upstream["tools"]) == ("auto", 3, TOOLS)
    (row,) = await h.rows()
    assert row["request"] == body
    assert not set(shaping) & set(row["engine_request"])
    assert row["engine_request"]["tool_choice"] == "auto"
    # the same job without `exact` passes them on: removing them is the job's choice
    await post(h, "/v1/chat/completions", body)
    assert set(shaping) <= set(sent(h)) and sent(h)["tool_choice"] == "required"


async def test_an_exact_job_removes_them_from_every_api_family(harness: Harness) -> None:
    config = {
        "temperature": 0, "presencePenalty": 0.5, "frequencyPenalty": 0.5,
        "responseMimeType": "application/json",
    }  # fmt: skip
    gemini = {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "generationConfig": config,
        "tools": [{"functionDeclarations": [{"name": "add"}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
    }
    await post(harness, "/v1beta/models/policy:generateContent", gemini, EXACT_SAMPLING)
    upstream = sent(harness)
    assert upstream["temperature"] == 0.9 and upstream["tool_choice"] == "auto"
    assert not {"presence_penalty", "frequency_penalty", "response_format"} & set(upstream)
    anthropic = {
        "model": "claude-x", "max_tokens": 100, "messages": MESSAGES,
        "tools": [{"name": "add", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "add"},
    }  # fmt: skip
    await post(harness, "/v1/messages", anthropic, EXACT_SAMPLING)
    assert sent(harness)["tool_choice"] == "auto"
