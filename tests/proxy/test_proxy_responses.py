"""OpenAI Responses through the proxy: answers shaped like OpenAI's, token ids exactly the engine's.

Golden files (`fixtures/responses/`) hold Responses API answers as the public API reference shows
them; the proxy's answers must match them key for key (ids, timestamps, texts and token counts
by type only). The in-process harness checks what is stored per call against the fake engine
called directly with the same chat request; the socket tests drive the official SDK through a
calculator tool loop, with the history re-sent (Codex) and with `previous_response_id`.
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import TYPE_CHECKING, Any, cast

import family_support
import httpx
import orjson
import pytest
from family_support import assert_like, assert_one_merged_sample, golden, parse_sse, wait_for_rows
from proxy_support import SECRET, Harness
from pydantic import TypeAdapter

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink
from polar_mq.proxy.apis import responses
from polar_mq.proxy.apis.base import FamilyError, FamilyRequest, Translation
from polar_mq.proxy.apis.response_store import ResponseStore

if TYPE_CHECKING:  # the SDK loads only where a test uses it: every xdist worker collects this file
    import openai

PATH = "/v1/responses"
CHAT = "/v1/chat/completions"
VOLATILE = frozenset(
    {
        "id",
        "item_id",
        "call_id",
        "created_at",
        "model",
        "text",
        "delta",
        "arguments",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "sequence_number",
    }
)
"""Keys whose values differ per call or per model: compared by type (unless an object)."""
DELTAS = (
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
)
CALCULATOR: Any = {
    "type": "function",
    "name": "calculator",
    "description": family_support.CALCULATOR_DESCRIPTION,
    "parameters": family_support.calculator_parameters(),
    "strict": False,
}
CHAT_CALCULATOR = {
    "type": "function",
    "function": {k: v for k, v in CALCULATOR.items() if k != "type"},
}
ENGINE_EXTRAS = {"model": "fake-model", "return_token_ids": True, "logprobs": True}
"""What the engine layer adds to every chat request it sends to vLLM."""


@functools.cache
def sdk_events() -> TypeAdapter[Any]:
    """The SDK's stream event union, built once and only by the tests that check events."""
    from openai.types.responses import ResponseStreamEvent

    return TypeAdapter(cast(Any, ResponseStreamEvent))


def assert_sdk_response(answer: dict[str, Any]) -> None:
    """The body is a valid SDK `Response` model."""
    from openai.types.responses import Response

    Response.model_validate(answer)


def sse(raw: bytes) -> list[dict[str, Any]]:
    """The stream's events as {"event", "data"}; every event must name its type twice."""
    assert b"\r" not in raw  # LF framing
    events = [{"event": name, "data": data} for name, data in parse_sse(raw)]
    assert all(e["event"] is not None for e in events)  # parse_sse: the name is the data's type
    assert [e["data"]["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        sdk_events().validate_python(event["data"])  # each event is a valid SDK event model
    return events


async def post_golden(h: Harness, name: str) -> tuple[dict[str, Any], httpx.Response]:
    """The golden case `name` and the proxy's (successful) answer to its request."""
    case: dict[str, Any] = golden("responses", f"{name}.json")
    response = await h.post(PATH, case["request"])
    assert response.status_code == 200, response.text
    return case, response


def collapsed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of delta events reduced to their first (the number of pieces depends on the model)."""
    out: list[dict[str, Any]] = []
    for event in events:
        if event["event"] in DELTAS and out and out[-1]["event"] == event["event"]:
            continue
        out.append(event)
    return out


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def engine_chat(messages: list[Any], **options: Any) -> dict[str, Any]:
    """The chat request the proxy must send to the engine for a Responses call."""
    return {**ENGINE_EXTRAS, "messages": messages, **options}


async def assert_captured(h: Harness, row: dict[str, Any], chat: dict[str, Any]) -> None:
    """The row holds what the engine answers to `chat` itself: prompt ids, sampled ids, logprobs."""
    direct = await h.direct(
        CHAT, {k: v for k, v in chat.items() if k != "stream_options"} | {"stream": False}
    )
    choice = direct["choices"][0]
    assert row["prompt_ids"] == direct["prompt_token_ids"]
    assert row["completion_ids"] == choice["token_ids"]
    assert row["logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert row["finish_reason"] == choice["finish_reason"]


def no_token_ids(raw: bytes) -> None:
    for key in (b"token_ids", b"prompt_token_ids", b'"logprob":', b"top_logprobs"):
        assert key not in raw


# Golden shapes -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name", ["text_response", "function_call_response", "custom_tool_call_response"]
)
async def test_answer_matches_golden_response(harness: Harness, name: str) -> None:
    case, response = await post_golden(harness, name)
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert_like(answer, case["response"], VOLATILE)
    assert answer["model"] == case["request"]["model"]
    assert answer["id"].startswith("resp_")
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert_sdk_response(answer)
    no_token_ids(response.content)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["text_stream", "function_call_stream", "custom_tool_call_stream"])
async def test_stream_matches_golden_events(harness: Harness, name: str) -> None:
    case, response = await post_golden(harness, name)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert b"[DONE]" not in response.content
    no_token_ids(response.content)
    events = sse(response.content)
    got, want = collapsed(events), collapsed(case["events"])
    assert [e["event"] for e in got] == [e["event"] for e in want]
    for actual, expected in zip(got, want, strict=True):
        assert_like(actual["data"], expected["data"], VOLATILE, actual["event"])
    ids = {e["data"]["response"]["id"] for e in events if "response" in e["data"]}
    assert len(ids) == 1  # one response id for the whole stream
    final = events[-1]["data"]["response"]
    item = final["output"][0]
    pieces = "".join(e["data"]["delta"] for e in events if e["event"] in DELTAS)
    whole = {
        "message": lambda: item["content"][0]["text"],
        "custom_tool_call": lambda: item["input"],
    }
    assert pieces == whole.get(item["type"], lambda: item["arguments"])()


# In-process: what is stored ----------------------------------------------------------------


@pytest.mark.anyio
async def test_text_call_is_captured(harness: Harness) -> None:
    body = {"model": "my-policy", "input": "What is 17 + 25?", "max_output_tokens": 64}
    response = await harness.post(PATH, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert output_text(answer) == "CALC: 17 + 25"
    assert answer["status"] == "completed" and answer["model"] == "my-policy"
    (row,) = await harness.rows()
    chat = engine_chat([{"role": "user", "content": "What is 17 + 25?"}], max_tokens=64)
    assert row["engine_request"] == chat
    assert (row["api_type"], row["request"], row["stream"], row["complete"]) == (
        "responses",
        body,
        False,
        True,
    )
    await assert_captured(harness, row, chat)
    assert answer["usage"]["input_tokens"] == len(row["prompt_ids"])
    assert answer["usage"]["output_tokens"] == len(row["completion_ids"])


@pytest.mark.anyio
async def test_tool_call_is_captured(harness: Harness) -> None:
    body = {
        "model": "my-policy",
        "instructions": "Use the calculator.",
        "input": [{"type": "message", "role": "user", "content": "What is 17 + 25?"}],
        "tools": [CALCULATOR],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "store": False,
    }
    response = await harness.post(PATH, body)
    answer = response.json()
    (call,) = answer["output"]
    assert call["type"] == "function_call" and call["name"] == "calculator"
    assert json.loads(call["arguments"]) == {"expression": "17 + 25"}
    assert call["id"].startswith("fc_") and call["call_id"].startswith("chatcmpl-tool-")
    assert answer["store"] is False and answer["parallel_tool_calls"] is False
    (row,) = await harness.rows()
    messages = [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 17 + 25?"},
    ]
    chat = engine_chat(
        messages, tools=[CHAT_CALCULATOR], tool_choice="required", parallel_tool_calls=False
    )
    assert row["engine_request"] == chat and row["request"] == body
    assert row["api_type"] == "responses" and row["finish_reason"] == "tool_calls"
    await assert_captured(harness, row, chat)
    assert len(harness.app.state.proxy.responses) == 0  # store: false keeps nothing


@pytest.mark.anyio
async def test_function_call_output_turn_is_captured_and_extends_the_prompt(
    harness: Harness,
) -> None:
    question = {"role": "user", "content": [{"type": "input_text", "text": "What is 17 + 25?"}]}
    first = await harness.post(
        PATH, {"model": "p", "input": [question], "tools": [CALCULATOR], "store": False}
    )
    call = first.json()["output"][0]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    body = {"model": "p", "input": [question, call, output], "tools": [CALCULATOR], "store": False}
    second = await harness.post(PATH, body)
    assert output_text(second.json()) == "ANSWER: 42"
    turn1, turn2 = await harness.rows()
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call["call_id"],
                "type": "function",
                "function": {"name": "calculator", "arguments": call["arguments"]},
            }
        ],
    }
    messages = [
        {"role": "user", "content": "What is 17 + 25?"},
        assistant,
        {"role": "tool", "tool_call_id": call["call_id"], "content": "42"},
    ]
    chat = engine_chat(messages, tools=[CHAT_CALCULATOR])
    assert turn2["engine_request"] == chat and turn2["request"] == body
    await assert_captured(harness, turn2, chat)
    history = turn1["prompt_ids"] + turn1["completion_ids"]
    assert turn2["prompt_ids"][: len(history)] == history


@pytest.mark.anyio
async def test_streamed_text_is_captured(harness: Harness) -> None:
    body = {"model": "my-policy", "input": "What is 17 + 25?", "stream": True}
    response = await harness.post(PATH, body)
    events = sse(response.content)
    text = "".join(e["data"]["delta"] for e in events if e["event"] == DELTAS[0])
    assert text == "CALC: 17 + 25"
    assert events[-1]["event"] == "response.completed"
    assert output_text(events[-1]["data"]["response"]) == text
    (row,) = await harness.rows()
    chat = engine_chat(
        [{"role": "user", "content": "What is 17 + 25?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert row["engine_request"] == chat and row["request"] == body
    assert (row["api_type"], row["stream"], row["complete"]) == ("responses", True, True)
    await assert_captured(harness, row, chat)
    assert events[-1]["data"]["response"]["usage"]["output_tokens"] == len(row["completion_ids"])


@pytest.mark.anyio
async def test_streamed_tool_call_is_captured(harness: Harness) -> None:
    body = {"model": "p", "input": "What is 6 * 7?", "tools": [CALCULATOR], "stream": True}
    response = await harness.post(PATH, body)
    events = sse(response.content)
    final = events[-1]["data"]["response"]
    (call,) = final["output"]
    assert json.loads(call["arguments"]) == {"expression": "6 * 7"}
    (row,) = await harness.rows()
    chat = engine_chat(
        [{"role": "user", "content": "What is 6 * 7?"}],
        tools=[CHAT_CALCULATOR],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert row["engine_request"] == chat
    assert (row["finish_reason"], row["complete"]) == ("tool_calls", True)
    await assert_captured(harness, row, chat)


@pytest.mark.anyio
async def test_previous_response_id_continues_the_stored_conversation(harness: Harness) -> None:
    first = (
        await harness.post(PATH, {"model": "p", "input": "What is 2 + 3?", "tools": [CALCULATOR]})
    ).json()
    call = first["output"][0]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "5"}
    body = {
        "model": "p",
        "previous_response_id": first["id"],
        "input": [output],
        "tools": [CALCULATOR],
        "stream": True,
    }
    events = sse((await harness.post(PATH, body)).content)
    final = events[-1]["data"]["response"]
    assert output_text(final) == "ANSWER: 5" and final["previous_response_id"] == first["id"]
    turn1, turn2 = await harness.rows()
    assert [m["role"] for m in turn2["engine_request"]["messages"]] == ["user", "assistant", "tool"]
    history = turn1["prompt_ids"] + turn1["completion_ids"]
    assert turn2["prompt_ids"][: len(history)] == history
    third = await harness.post(
        PATH, {"model": "p", "previous_response_id": final["id"], "input": "RESULT: 5"}
    )
    assert output_text(third.json()) == "ANSWER: 5"
    roles = [m["role"] for m in (await harness.rows())[2]["engine_request"]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]


@pytest.mark.anyio
async def test_length_cut_is_incomplete(harness: Harness) -> None:
    body = {"model": "p", "input": "What is 17 + 25?", "max_output_tokens": 4}
    answer = (await harness.post(PATH, body)).json()
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["output"][0]["status"] == "incomplete"
    events = sse((await harness.post(PATH, {**body, "stream": True})).content)
    assert events[-1]["event"] == "response.incomplete"
    assert events[-1]["data"]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    rows = await harness.rows()
    assert [r["finish_reason"] for r in rows] == ["length", "length"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", None),
        (orjson.dumps({"model": "p", "input": [{"type": "item_reference", "id": "x"}]}), "item"),
        (orjson.dumps({"model": "p", "input": "hi", "tools": [{"type": "web_search"}]}), "tool"),
        (orjson.dumps({"model": "p", "input": "hi", "previous_response_id": "resp_x"}), "resp_x"),
        (orjson.dumps({"input": "hi"}), "model"),
        (orjson.dumps({"model": "p", "input": "hi", "background": True}), "background"),
    ],
)
async def test_bad_input_is_refused_in_openai_shape(
    harness: Harness, raw: bytes, message: str | None
) -> None:
    headers = {**harness.auth, "content-type": "application/json"}
    response = await harness.client.post(PATH, content=raw, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if message is not None:
        assert message in error["message"]
    if message == "resp_x":
        assert (error["code"], error["param"]) == (
            "previous_response_not_found",
            "previous_response_id",
        )
    assert await harness.rows() == []
    assert harness.stats.requests == 0


@pytest.mark.anyio
async def test_unauthenticated_call_is_refused_in_openai_shape(harness: Harness) -> None:
    response = await harness.client.post(PATH, json={"model": "p", "input": "hi"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert await harness.rows() == []


@pytest.mark.anyio
async def test_token_in_the_url_reaches_the_same_route(harness: Harness) -> None:
    response = await harness.client.post(
        f"/r/{harness.token}{PATH}", json={"model": "p", "input": "What is 1 + 1?"}
    )
    assert response.status_code == 200 and output_text(response.json()) == "CALC: 1 + 1"
    (row,) = await harness.rows()
    assert (row["api_type"], row["rollout_id"]) == ("responses", harness.rollout_id)


@pytest.mark.anyio
async def test_previous_response_of_another_rollout_is_not_found(harness: Harness) -> None:
    first = (await harness.post(PATH, {"model": "p", "input": "hi"})).json()
    other = issue_rollout_token(SECRET, uuid.uuid4(), 600)
    body = {"model": "p", "input": "again", "previous_response_id": first["id"]}
    response = await harness.client.post(
        PATH, json=body, headers={"authorization": f"Bearer {other}"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "previous_response_not_found"


# Request translation ----------------------------------------------------------------------


def translate(body: dict[str, Any], store: ResponseStore | None = None) -> Translation:
    return responses.to_chat(body, FamilyRequest(rollout_id=uuid.UUID(int=1), responses=store))


def test_items_become_chat_messages() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    items = [
        {"role": "developer", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Look:"}, image],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Ok."}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "two"}],
        },
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "ignored"}],
            "content": [{"type": "reasoning_text", "text": "think"}],
        },
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
    ]
    body = {
        "model": "m",
        "instructions": "System.",
        "input": items,
        "tool_choice": {"type": "function", "name": "f"},
        "temperature": 0.5,
        "top_p": 0.9,
        "text": {
            "format": {
                "type": "json_schema",
                "name": "out",
                "schema": {"type": "object"},
                "strict": True,
            }
        },
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "reasoning": {"effort": "low"},
        "metadata": {"a": "b"},
        "truncation": "auto",
        "service_tier": "auto",
        "background": False,
        "user": "u",
    }
    translation = translate(body)
    assert translation.stream is False and translation.agent_model == "m"
    call = lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}}  # noqa: E731
    assert translation.chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "System."},
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {
                        "type": "image_url",
                        "image_url": {"url": image["image_url"], "detail": "low"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": "Ok.",
                "reasoning": "s",
                "tool_calls": [call("c1", "f", "{}"), call("c2", "g", '{"a":1}')],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
            {
                "role": "assistant",
                "content": None,
                "reasoning": "think",
                "tool_calls": [call("c3", "f", "{}")],
            },
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "temperature": 0.5,
        "top_p": 0.9,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
    }


def test_custom_tools_become_functions_with_one_string_argument() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: WORD"}
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "Patch it."},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** X"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
        ],
        "tools": [
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "Edit files.",
                "format": grammar,
            },
            {"type": "custom", "name": "note"},
        ],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
    }
    chat = translate(body).chat
    patch, note = chat["tools"]
    assert patch["function"]["name"] == "apply_patch"
    assert patch["function"]["description"] == "Edit files."
    parameters = patch["function"]["parameters"]
    assert parameters["required"] == ["input"] and parameters["additionalProperties"] is False
    assert parameters["properties"]["input"]["type"] == "string"
    assert "lark grammar:\nstart: WORD" in parameters["properties"]["input"]["description"]
    assert "description" not in note["function"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": '{"input": "*** X"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Done!"},
    ]
    assert translate(body).chat == chat  # deterministic: a re-sent history renders the same


@pytest.mark.parametrize(
    ("arguments", "tool_input"),
    [
        ('{"input": "a\\nb"}', "a\nb"),
        ('{"patch": "p"}', "p"),  # the model named the one argument its own way
        ("raw text", "raw text"),
        ('{"a": "1", "b": "2"}', '{"a": "1", "b": "2"}'),
    ],
)
def test_custom_tool_call_input_from_the_models_arguments(arguments: str, tool_input: str) -> None:
    tools = [{"type": "custom", "name": "apply_patch"}, CALCULATOR]
    translation = translate({"model": "m", "input": "x", "tools": tools})
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "apply_patch", "arguments": arguments},
        },
        {"id": "c2", "type": "function", "function": {"name": "calculator", "arguments": "{}"}},
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    data = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    answer = responses.render(data, translation)
    assert_sdk_response(answer)
    patch, calc = answer["output"]
    assert patch["type"] == "custom_tool_call" and patch["id"].startswith("ctc_")
    assert (patch["call_id"], patch["name"], patch["input"]) == ("c1", "apply_patch", tool_input)
    assert calc["type"] == "function_call" and calc["arguments"] == "{}"


def test_stream_custom_tool_call_is_sent_decoded_and_whole() -> None:
    tools = [{"type": "custom", "name": "apply_patch"}]
    translator = responses.stream(translate({"model": "m", "input": "x", "tools": tools}))
    chunks = [
        chunk(tool_delta(0, "", id="call_p", type="function", name="apply_patch")),
        chunk(tool_delta(0, '{"input": "*** Begin')),
        chunk(tool_delta(0, ' Patch\\n"}')),
        chunk({}, finish="tool_calls"),
    ]
    raw = b"".join(translator.chunk(c) for c in chunks) + translator.done()
    events = sse(raw)
    names = [e["event"] for e in events]
    assert names[2:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["data"]["item"]
    assert (added["type"], added["input"], added["status"]) == (
        "custom_tool_call",
        "",
        "in_progress",
    )
    assert events[3]["data"]["delta"] == events[4]["data"]["input"] == "*** Begin Patch\n"
    final = events[-1]["data"]["response"]["output"]
    assert final == [events[5]["data"]["item"]]
    assert final[0]["input"] == "*** Begin Patch\n" and final[0]["call_id"] == "call_p"


def test_json_object_and_stream_options() -> None:
    body = {"model": "m", "input": "x", "stream": True, "text": {"format": {"type": "json_object"}}}
    chat = translate(body).chat
    assert chat["response_format"] == {"type": "json_object"}
    assert (chat["stream"], chat["stream_options"]) == (True, {"include_usage": True})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": [{"type": "file_search_call"}]}, "unsupported item type 'file_search_call'"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input_file",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "image_url",
        ),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": []}, "at least one message"),
        ({"input": 3}, "input"),
    ],
)
def test_bad_requests_raise(body: dict[str, Any], message: str) -> None:
    with pytest.raises(FamilyError) as caught:
        translate({"model": "m", **body})
    assert message in caught.value.message and caught.value.status == 400


def test_error_response_shapes() -> None:
    for status, kind, kind_type in [
        (401, "authentication", "authentication_error"),
        (413, "too_large", "invalid_request_error"),
        (429, "rate_limited", "rate_limit_error"),
        (502, "upstream", "server_error"),
        (503, "unavailable", "server_error"),
    ]:
        response = responses.error_response(status, kind, "why")
        assert response.status_code == status
        error = orjson.loads(bytes(response.body))["error"]
        assert (error["type"], error["message"]) == (kind_type, "why")


# Stream translator on chunks the fake never sends -------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> Any:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


def tool_delta(index: int, arguments: str, **head: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if "name" in head:
        function["name"] = head.pop("name")
    return {"tool_calls": [{"index": index, **head, "function": function}]}


def run_stream(chunks: list[Any], end: str = "done", store: ResponseStore | None = None) -> Any:
    translator = responses.stream(translate({"model": "m", "input": "x"}, store))
    raw = b"".join(translator.chunk(c) for c in chunks)
    raw += translator.done() if end == "done" else translator.fail(end)
    assert translator.done() == b"" and translator.fail("again") == b""
    return sse(raw)


def test_stream_reasoning_text_and_split_tool_calls() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19}
    events = run_stream(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning": "Let me "}),
            chunk({"reasoning_content": "think."}),
            chunk({"content": "Calling"}),
            chunk({"content": " tools."}),
            chunk(tool_delta(0, "", id="call_a", type="function", name="calculator")),
            chunk(tool_delta(0, '{"expr')),
            chunk(tool_delta(0, 'ession": "1+1"}')),
            chunk(tool_delta(1, '{"x":', id="call_b")),  # arguments before the name
            chunk(tool_delta(1, " 2}", name="other")),
            chunk({}, finish="tool_calls"),
            chunk(None, usage=usage),
        ]
    )
    names = [e["event"] for e in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert (
        names.count("response.output_item.added") == names.count("response.output_item.done") == 4
    )
    assert names[-1] == "response.completed"
    final = events[-1]["data"]["response"]
    reasoning, message, first, second = final["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "Let me think."
    assert message["content"][0]["text"] == "Calling tools."
    assert (first["call_id"], first["name"], first["arguments"]) == (
        "call_a",
        "calculator",
        '{"expression": "1+1"}',
    )
    assert (second["call_id"], second["name"], second["arguments"]) == (
        "call_b",
        "other",
        '{"x": 2}',
    )
    assert [i["status"] for i in final["output"]] == ["completed"] * 4
    assert final["usage"]["input_tokens"] == 10 and final["usage"]["total_tokens"] == 19
    done_items = [e["data"]["item"] for e in events if e["event"] == "response.output_item.done"]
    assert done_items == final["output"]
    argument_deltas = [
        e["data"]["delta"] for e in events if e["event"] == "response.function_call_arguments.delta"
    ]
    assert argument_deltas == ['{"expr', 'ession": "1+1"}', '{"x": 2}']
    # Items are opened one after the other, each closed before the next one starts.
    opened = [
        e["data"]["output_index"] for e in events if e["event"].startswith("response.output_item")
    ]
    assert opened == [0, 0, 1, 1, 2, 2, 3, 3]


def test_stream_engine_error_and_broken_upstream_fail() -> None:
    error = {"error": {"message": "engine exploded", "type": "InternalServerError", "code": 500}}
    events = run_stream([chunk({"content": "Hi"}), error, chunk({"content": "late"})])
    assert events[-1]["event"] == "response.failed"
    failed = events[-1]["data"]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "engine exploded"}
    assert failed["output"][0]["status"] == "incomplete"
    assert not any(e["data"].get("delta") == "late" for e in events)
    broken = run_stream([], end="upstream broke off")
    assert [e["event"] for e in broken] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert broken[-1]["data"]["response"]["error"]["message"] == "upstream broke off"


def test_stream_remembers_the_conversation_unless_it_failed() -> None:
    store = ResponseStore()
    events = run_stream([chunk({"content": "Hi"}), chunk({}, finish="stop")], store=store)
    final = events[-1]["data"]["response"]
    kept = store.get(final["id"], uuid.UUID(int=1))
    assert kept is not None and kept[0]["content"] == "x" and kept[1] == final["output"][0]
    failed = run_stream([chunk({"content": "Hi"})], end="gone", store=store)
    assert store.get(failed[-1]["data"]["response"]["id"], uuid.UUID(int=1)) is None


def test_render_reasoning_and_length() -> None:
    translation = translate({"model": "m", "input": "x"})
    data = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "part", "reasoning": "hmm"},
                "finish_reason": "length",
                "token_ids": [1, 2],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "prompt_token_ids": [7, 8, 9],
    }
    answer = responses.render(data, translation)
    assert_sdk_response(answer)
    assert [(i["type"], i["status"]) for i in answer["output"]] == [
        ("reasoning", "completed"),
        ("message", "incomplete"),
    ]
    assert answer["status"] == "incomplete" and "token_ids" not in orjson.dumps(answer).decode()


# The official SDK over real sockets ---------------------------------------------------------


# The fake engine: one process (its CLI) for the module; a fresh proxy and sink for each test.
fake_engine, served = family_support.socket_fixtures()


def sdk_client(url: str, rollout: uuid.UUID) -> openai.OpenAI:
    import openai

    token = issue_rollout_token(SECRET, rollout, 600)
    return openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=20)


def create(client: openai.OpenAI, streaming: bool, **kwargs: Any) -> Any:
    """One Responses call through the SDK, streamed (`responses.stream`) or not (`.create`)."""
    if not streaming:
        return client.responses.create(model="policy", tools=[CALCULATOR], **kwargs)
    with client.responses.stream(model="policy", tools=[CALCULATOR], **kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    return final


@pytest.mark.parametrize("streaming", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("history", ["resent", "previous_response_id"])
def test_sdk_function_call_loop(
    served: tuple[str, MemoryCallSink], streaming: bool, history: str
) -> None:
    url, sink = served
    rollout = uuid.uuid4()
    client = sdk_client(url, rollout)
    question: Any = {"role": "user", "content": "What is 17 + 25?"}
    store = history != "resent"
    first = create(client, streaming, input=[question], store=store)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "calculator"
    assert json.loads(call.arguments) == {"expression": "17 + 25"}
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
    if store:
        second = create(client, streaming, input=[result], previous_response_id=first.id)
    else:  # Codex: no server state, the whole history every turn
        items = [question, *(i.model_dump(exclude_none=True) for i in first.output), result]
        second = create(client, streaming, input=items, store=False)
    assert second.output_text == "ANSWER: 42" and second.status == "completed"
    assert second.model == "policy" and second.usage is not None
    rows = wait_for_rows(sink, 2)
    assert len(rows) == 2
    assert all(r["api_type"] == "responses" and r["rollout_id"] == rollout for r in rows)
    assert all(r["complete"] and r["prompt_ids"] and r["completion_ids"] for r in rows)
    assert all(len(r["logprobs"]) == len(r["completion_ids"]) for r in rows)
    assert [r["stream"] for r in rows] == [streaming, streaming]
    assert_one_merged_sample(rows)  # its call ids are the rows', none broken


def test_sdk_sees_openai_errors(served: tuple[str, MemoryCallSink]) -> None:
    import openai

    url, sink = served
    client = sdk_client(url, uuid.uuid4())
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="policy", input="hi", previous_response_id="resp_missing")
    assert caught.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="policy", input="hi", tools=[{"type": "web_search"}])
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0, timeout=20)
    with pytest.raises(openai.AuthenticationError):
        bad.responses.create(model="policy", input="hi")
    assert sink.rows == []
