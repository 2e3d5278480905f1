"""Anthropic Messages through the proxy: translated to chat, answered in Anthropic's shapes.

The fake engine speaks chat completions only (like vLLM with `return_token_ids`), so every test
here goes through the translation; stored ids are compared with what the engine returns for the
same chat request called directly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from family_support import (
    CALCULATOR_DESCRIPTION,
    assert_one_merged_sample,
    assert_same_shape,
    calculator_parameters,
    fake_engine_process,
    golden,
    parse_sse,
    proxy_served,
    rows_of,
)
from proxy_support import SECRET, Harness, proxy_settings, start_harness

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink
from polar_mq.proxy.apis import anthropic as messages_api
from polar_mq.proxy.apis.anthropic_stream import MessagesStream
from polar_mq.proxy.apis.base import FamilyError, FamilyRequest, Translation

if TYPE_CHECKING:  # the SDK loads only where a test uses it: every xdist worker collects this file
    import anthropic

pytestmark = pytest.mark.anyio

CALCULATOR: Any = {
    "name": "calculator",
    "description": CALCULATOR_DESCRIPTION,
    "input_schema": calculator_parameters(),
}
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "fine-grained-tool-streaming"}


@pytest.fixture
async def streaming_harness() -> Any:
    async for h in start_harness(proxy_settings(), streaming=True):
        yield h


async def _post(h: Harness, body: dict[str, Any], path: str = "/v1/messages") -> Any:
    return await h.client.post(path, json=body, headers={**HEADERS, "x-api-key": h.token})


async def _assert_exact_ids(h: Harness, row: dict[str, Any]) -> None:
    """The stored ids and logprobs are what the engine returns for the stored engine request."""
    direct = await h.direct("/v1/chat/completions", {**row["engine_request"], "stream": False})
    assert row["prompt_ids"] == direct["prompt_token_ids"]
    assert row["completion_ids"] == direct["choices"][0]["token_ids"]
    expected = [entry["logprob"] for entry in direct["choices"][0]["logprobs"]["content"]]
    assert row["logprobs"] == pytest.approx(expected, abs=1e-6)


async def test_text_answer_matches_the_golden_message(harness: Harness) -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 200,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "Say hello."}],
        "metadata": {"user_id": "u-1"},
    }
    response = await _post(harness, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert_same_shape(answer, golden("anthropic", "message_text.json"))
    assert (answer["type"], answer["role"], answer["model"]) == (
        "message",
        "assistant",
        "claude-sonnet-4-5",
    )
    assert answer["stop_reason"] == "end_turn" and answer["content"][0]["type"] == "text"
    assert "token_ids" not in response.text and "prompt_token_ids" not in response.text
    (row,) = await harness.rows()
    assert (row["api_type"], row["stream"], row["complete"]) == ("anthropic_messages", False, True)
    assert row["request"] == body
    assert row["engine_request"]["model"] == "fake-model"  # rewritten to the served model
    assert row["engine_request"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ]
    assert answer["usage"]["input_tokens"] == len(row["prompt_ids"])
    assert answer["usage"]["output_tokens"] == len(row["completion_ids"])
    await _assert_exact_ids(harness, row)


async def test_a_system_turn_inside_messages_stays_a_system_message_in_place(
    harness: Harness,
) -> None:
    """Claude Code 2.1.3xx sends its environment section as a `system` turn after the first user
    turn; it is a system message at that place in the engine's chat, and the call is logged."""
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 50,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
            {
                "role": "system",
                "content": [{"type": "text", "text": "# Environment", "cache_control": {}}],
            },
        ],
    }
    response = await _post(harness, body)
    assert response.status_code == 200, response.text
    (row,) = await harness.rows()
    assert row["engine_request"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
        {"role": "system", "content": "# Environment"},
    ]
    assert row["prompt_ids"] and row["completion_ids"]


async def test_tool_loop_non_streamed_is_one_merged_sample(harness: Harness) -> None:
    body: dict[str, Any] = {
        "model": "claude-opus-4-1",
        "max_tokens": 512,
        "tools": [CALCULATOR],
        "tool_choice": {"type": "auto"},
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
    }
    first = (await _post(harness, body)).json()
    assert_same_shape(first, golden("anthropic", "message_tool_use.json"))
    (tool_use,) = first["content"]
    assert tool_use["type"] == "tool_use" and tool_use["name"] == "calculator"
    assert tool_use["input"] == {"expression": "17 + 25"}
    assert first["stop_reason"] == "tool_use"
    body["messages"] += [
        {"role": "assistant", "content": first["content"]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_use["id"], "content": "42"},
                {"type": "text", "text": "Now answer."},
            ],
        },
    ]
    second = (await _post(harness, body)).json()
    assert second["content"] == [{"type": "text", "text": "ANSWER: 42"}] or second["content"][0][
        "text"
    ].startswith("ANSWER")
    rows = await harness.rows()
    assert [r["seq"] for r in rows] == [0, 1]
    messages = rows[1]["engine_request"]["messages"]
    assert messages[1]["tool_calls"][0]["id"] == tool_use["id"]
    assert messages[2] == {"role": "tool", "tool_call_id": tool_use["id"], "content": "42"}
    assert messages[3] == {"role": "user", "content": "Now answer."}
    history = rows[0]["prompt_ids"] + rows[0]["completion_ids"]
    assert rows[1]["prompt_ids"][: len(history)] == history
    assert_one_merged_sample(rows)
    for row in rows:
        await _assert_exact_ids(harness, row)


async def test_streamed_text_follows_the_real_event_sequence(streaming_harness: Harness) -> None:
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "Please compute (3 + 4) * 5."}],
    }
    response = await _post(streaming_harness, body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    expected = dict(parse_sse(golden("anthropic", "stream_text.sse")))  # one example per name
    for name, data in events:
        assert data["type"] == name
        assert_same_shape(data, expected[name])
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "CALC: (3 + 4) * 5"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    (row,) = await streaming_harness.rows()
    assert (row["stream"], row["complete"], row["finish_reason"]) == (True, True, "stop")
    assert row["ttft_ms"] is not None
    assert events[-2][1]["usage"]["output_tokens"] == len(row["completion_ids"])
    await _assert_exact_ids(streaming_harness, row)


async def test_streamed_tool_use_block(streaming_harness: Harness) -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "stream": True,
        "tools": [CALCULATOR],
        "messages": [{"role": "user", "content": "What is 6 * 7?"}],
    }
    events = parse_sse((await _post(streaming_harness, body)).text)
    expected = dict(parse_sse(golden("anthropic", "stream_tool_use.sse")))
    for name, data in events:
        assert_same_shape(data, expected[name])
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"]
    assert starts[0]["content_block"]["name"] == "calculator"
    partial = "".join(
        d["delta"]["partial_json"] for n, d in events if d["type"] == "content_block_delta"
    )
    assert partial == '{"expression": "6 * 7"}'
    message_delta = next(d for n, d in events if n == "message_delta")
    assert message_delta["delta"]["stop_reason"] == "tool_use"
    (row,) = await streaming_harness.rows()
    assert row["complete"] and row["finish_reason"] == "tool_calls"
    await _assert_exact_ids(streaming_harness, row)


def _chunk(delta: dict[str, Any], finish: str | None = None, ids: list[int] | None = None) -> Any:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "token_ids": ids or [1]}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}


def test_stream_translator_handles_fragmented_reasoning_text_and_tools() -> None:
    """vLLM streams reasoning, then text, then tool calls whose arguments come in pieces."""
    translation = Translation(chat={}, stream=True, agent_model="claude-x")
    stream = MessagesStream(translation)
    out = stream.chunk({"choices": [], "prompt_token_ids": [5, 6, 7]})
    out += stream.chunk(_chunk({"reasoning": "Let me "}))
    out += stream.chunk(_chunk({"reasoning": "think."}))
    out += stream.chunk(_chunk({"content": "Calling."}))
    out += stream.chunk(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a'}}]}))
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    out += stream.chunk(_chunk({"tool_calls": [first]}))
    out += stream.chunk(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]}))
    second = {"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}
    out += stream.chunk(_chunk({"tool_calls": [second]}, finish="tool_calls"))
    out += stream.chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    out += stream.done()
    events = parse_sse(out.decode())
    starts = [(d["index"], d["content_block"]) for n, d in events if n == "content_block_start"]
    assert [(i, b["type"]) for i, b in starts] == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
        (3, "tool_use"),
    ]
    assert starts[2][1]["id"] == "call_1" and starts[3][1]["name"] == "g"
    deltas = [d for n, d in events if n == "content_block_delta"]
    thinking = "".join(d["delta"].get("thinking", "") for d in deltas if d["index"] == 0)
    assert thinking == "Let me think."
    arguments = "".join(d["delta"]["partial_json"] for d in deltas if d["index"] == 2)
    assert arguments == '{"a": 1}'
    stops = [d["index"] for n, d in events if n == "content_block_stop"]
    assert stops == [0, 1, 2, 3]
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 9
    assert events[0][1]["message"]["usage"]["input_tokens"] == 3
    assert events[-1][0] == "message_stop"


def test_stream_translator_reports_an_engine_error_once() -> None:
    stream = MessagesStream(Translation(chat={}, stream=True, agent_model="m"))
    out = stream.chunk(_chunk({"content": "Hi"}))
    out += stream.chunk({"error": {"message": "engine overloaded", "code": 500}})
    out += stream.done() + stream.fail("again")
    events = parse_sse(out.decode())
    assert [n for n, _ in events].count("error") == 1
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "engine overloaded"}},
    )


def test_request_translation_of_every_block_kind() -> None:
    body = {
        "model": "claude",
        "max_tokens": 100,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop_sequences": ["STOP"],
        "system": "sys",
        "tools": [CALCULATOR],
        "tool_choice": {"type": "tool", "name": "calculator", "disable_parallel_tool_use": True},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xyz"},
                    {"type": "text", "text": "Using a tool."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "calculator",
                        "input": {"expression": "1+1"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": False,
                        "content": [{"type": "text", "text": "2"}],
                    }
                ],
            },
        ],
    }
    translation = messages_api.to_chat(body, FamilyRequest(rollout_id=uuid.uuid4()))
    chat = translation.chat
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert chat["parallel_tool_calls"] is False
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["stop"]) == (
        0.7,
        0.9,
        20,
        ["STOP"],
    )
    assert chat["tools"][0]["function"]["parameters"] == CALCULATOR["input_schema"]
    system, user, assistant, tool = chat["messages"]
    assert system == {"role": "system", "content": "sys"}
    assert user["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAA"},
    }
    assert assistant["reasoning"] == "hmm" and assistant["content"] == "Using a tool."
    assert assistant["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": '{"expression":"1+1"}',
    }
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "2"}
    assert "stream" not in chat and translation.agent_model == "claude"


def test_render_maps_reasoning_stop_sequences_and_length() -> None:
    translation = Translation(
        chat={}, stream=False, agent_model="claude", context={"stops": ["END"]}
    )
    message = {"role": "assistant", "content": "done", "reasoning": "because"}
    data = {
        "choices": [
            {"index": 0, "message": message, "finish_reason": "stop", "stop_reason": "END"}
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2},
    }
    answer = messages_api.render(data, translation)
    assert answer["content"] == [
        {"type": "thinking", "thinking": "because", "signature": ""},
        {"type": "text", "text": "done"},
    ]
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", "END")
    data["choices"][0]["finish_reason"] = "length"
    assert messages_api.render(data, translation)["stop_reason"] == "max_tokens"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            "unsupported content block type 'document'",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "hologram"}]}],
            },
            "'hologram'",
        ),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "role",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "messages": [{"role": "user", "content": "hi"}],
            },
            "server tool",
        ),
        (
            {"model": "m", "max_tokens": "many", "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
    ],
)
async def test_bad_input_is_an_anthropic_4xx_and_nothing_is_logged(
    harness: Harness, body: dict[str, Any], fragment: str
) -> None:
    response = await _post(harness, body)
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert fragment in error["error"]["message"]
    assert await harness.rows() == []
    assert harness.stats.requests == 0


async def test_malformed_oversized_unauthorized_and_engine_errors_keep_the_shape(
    harness: Harness,
) -> None:
    headers = {"x-api-key": harness.token, "content-type": "application/json"}
    malformed = await harness.client.post("/v1/messages", content=b"{not json", headers=headers)
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"
    big = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 70_000}]}
    too_large = await _post(harness, big)
    assert too_large.status_code == 413
    assert too_large.json()["error"]["type"] == "request_too_large"
    bad_key = await harness.client.post(
        "/v1/messages", json={"model": "m"}, headers={"x-api-key": "pmq_forged"}
    )
    assert bad_key.status_code == 401
    assert bad_key.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": bad_key.json()["error"]["message"]},
    }
    # The engine refuses more tokens than its context holds: the agent gets its 400, reshaped.
    huge = {"model": "m", "max_tokens": 1 << 29, "messages": [{"role": "user", "content": "hi"}]}
    refused = await _post(harness, huge)
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in refused.json()["error"]["message"]
    rows = await harness.rows()
    assert [(r["status_code"], r["complete"]) for r in rows] == [(400, False)]  # forwarded, failed


async def test_token_from_bearer_path_and_root_probe(harness: Harness) -> None:
    body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    bearer = await harness.client.post(
        "/v1/messages", json=body, headers={"authorization": f"Bearer {harness.token}"}
    )
    assert bearer.status_code == 200
    path = await harness.client.post(
        f"/r/{harness.token}/v1/messages?beta=true", json=body, headers={"x-api-key": "sk-ant-x"}
    )
    assert path.status_code == 200
    assert (await harness.client.head("/")).status_code == 200
    assert (await harness.client.head(f"/r/{harness.token}")).status_code == 200
    assert len(await harness.rows()) == 2


async def test_count_tokens_uses_the_engine_tokenizer(harness: Harness) -> None:
    body = {"model": "claude", "messages": [{"role": "user", "content": "What is 1 + 2?"}]}
    counted = await _post(harness, body, "/v1/messages/count_tokens")
    assert counted.status_code == 200
    answer = await _post(harness, {**body, "max_tokens": 50})
    (row,) = await harness.rows()  # counting is not a call
    assert counted.json() == {"input_tokens": len(row["prompt_ids"])}
    assert answer.json()["usage"]["input_tokens"] == counted.json()["input_tokens"]
    bad = await _post(harness, {"model": "claude", "messages": "no"}, "/v1/messages/count_tokens")
    assert bad.status_code == 400 and bad.json()["type"] == "error"


def test_family_error_is_raised_for_bad_tool_choice() -> None:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(FamilyError, match="tool_choice"):
        messages_api.to_chat(
            {**body, "tool_choice": {"type": "maybe"}}, FamilyRequest(uuid.uuid4())
        )


@pytest.fixture(scope="module")
def sdk_proxy() -> Iterator[tuple[str, MemoryCallSink]]:
    with fake_engine_process() as engine_url, proxy_served(engine_url) as served:
        yield served


def _sdk(url: str) -> tuple[anthropic.Anthropic, uuid.UUID]:
    import anthropic

    rollout = uuid.uuid4()
    token = issue_rollout_token(SECRET, rollout, 600)
    return anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=20), rollout


def test_sdk_messages_create_tool_loop(sdk_proxy: tuple[str, MemoryCallSink]) -> None:
    url, sink = sdk_proxy
    client, rollout = _sdk(url)
    messages: list[Any] = [{"role": "user", "content": "What is 19 * 3?"}]
    tools: Any = [CALCULATOR]
    first = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=messages
    )
    assert first.stop_reason == "tool_use" and first.model == "claude-sonnet-4-5"
    tool_use = next(b for b in first.content if b.type == "tool_use")
    assert tool_use.input == {"expression": "19 * 3"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "57"}],
        },
    ]
    second = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=messages
    )
    assert second.content[0].type == "text" and second.content[0].text == "ANSWER: 57"
    rows = rows_of(sink, rollout, 2)
    assert all(r["prompt_ids"] and r["completion_ids"] and r["logprobs"] for r in rows)
    assert_one_merged_sample(rows)


def test_sdk_messages_stream_tool_loop(sdk_proxy: tuple[str, MemoryCallSink]) -> None:
    url, sink = sdk_proxy
    client, rollout = _sdk(url)
    messages: list[Any] = [{"role": "user", "content": "What is 8 + 9?"}]
    tools: Any = [CALCULATOR]
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=messages
    ) as stream:
        first = stream.get_final_message()
    tool_use = next(b for b in first.content if b.type == "tool_use")
    assert tool_use.input == {"expression": "8 + 9"} and first.stop_reason == "tool_use"
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "17"}],
        },
    ]
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=messages
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "ANSWER: 17" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0
    rows = rows_of(sink, rollout, 2)
    assert all(r["stream"] and r["complete"] and r["completion_ids"] for r in rows)
    assert_one_merged_sample(rows)


def test_sdk_sees_anthropic_errors(sdk_proxy: tuple[str, MemoryCallSink]) -> None:
    import anthropic

    url, _ = sdk_proxy
    client = anthropic.Anthropic(base_url=url, api_key="pmq_forged", max_retries=0, timeout=20)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(
            model="claude", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    client, _ = _sdk(url)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="claude",
            max_tokens=5,
            messages=[{"role": "user", "content": [{"type": "hologram"}]}],  # type: ignore[list-item]
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
