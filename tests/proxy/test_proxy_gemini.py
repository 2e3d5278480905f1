"""The Gemini API family: `/v1beta/models/{model}:{action}` translated to the engine's chat API.

What an agent on Google's API sees (golden answers written from the public API reference, field
for field), what the proxy stores (the agent's body, the chat request it became, and the exact
token ids the engine returned for that chat request), and Google's own SDK driving a function
call loop through the proxy on a real socket, whose calls merge into one training sample.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import family_support
import httpx
import pytest
from family_support import assert_like, assert_one_merged_sample, golden, parse_sse, wait_for_rows
from proxy_support import SECRET, Harness

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink
from polar_mq.proxy.apis import gemini
from polar_mq.proxy.apis.base import FamilyError, FamilyRequest, Translation
from polar_mq.proxy.apis.gemini_response import GeminiStream

if TYPE_CHECKING:  # the SDK loads only where a test uses it: every xdist worker collects this file
    from google import genai
    from google.genai import types

CHAT = "/v1/chat/completions"
GENERATE = "/v1beta/models/policy:generateContent"
STREAM = "/v1beta/models/policy:streamGenerateContent"
COUNT = "/v1beta/models/policy:countTokens"
QUESTION = "What is 17 + 25?"
VOLATILE = {"responseId", "id", "promptTokenCount", "candidatesTokenCount", "totalTokenCount"}
"""Keys whose values differ from the golden ones by nature (ids, counts): type-checked only."""
CALCULATOR_DECLARATION: dict[str, Any] = {
    "name": "calculator",
    "description": family_support.CALCULATOR_DESCRIPTION,
    "parameters": {
        "type": "OBJECT",
        "properties": {"expression": {"type": "STRING", "description": "e.g. 2 + 2"}},
        "required": ["expression"],
        "propertyOrdering": ["expression"],
    },
}
CALCULATOR_CHAT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": family_support.CALCULATOR_DESCRIPTION,
        "parameters": family_support.calculator_parameters(description="e.g. 2 + 2"),
    },
}
TOOLS = [{"functionDeclarations": [CALCULATOR_DECLARATION]}]
TOOLS_CHAT = [CALCULATOR_CHAT_TOOL]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def key(h: Harness) -> dict[str, str]:
    return {"x-goog-api-key": h.token}


async def post(h: Harness, path: str, body: dict[str, Any]) -> httpx.Response:
    return await h.client.post(path, json=body, headers=key(h))


def engine_view(chat: dict[str, Any]) -> dict[str, Any]:
    """The chat request as the proxy sends it to the engine (ids and logprobs on, served model)."""
    return {**chat, "model": "fake-model", "return_token_ids": True, "logprobs": True}


def sse_documents(body: str | bytes) -> list[dict[str, Any]]:
    """The `data:` documents of an SSE body (CRLF or LF framing, as Google or we send it)."""
    events = parse_sse(body)
    assert all(name is None for name, _ in events), events
    return [document for _, document in events]


def golden_events(name: str) -> list[dict[str, Any]]:
    return sse_documents(golden("gemini", name))


def assert_usage(answer: dict[str, Any], row: dict[str, Any]) -> None:
    prompt, completion = len(row["prompt_ids"]), len(row["completion_ids"])
    assert answer["usageMetadata"] == {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": prompt + completion,
    }


async def assert_captured_like_direct(
    h: Harness, row: dict[str, Any], chat: dict[str, Any]
) -> None:
    """The row's ids and logprobs are the engine's own for the chat request `chat`."""
    direct = await h.direct(CHAT, engine_view({**chat, "stream": False}))
    choice = direct["choices"][0]
    assert row["prompt_ids"] == direct["prompt_token_ids"]
    assert row["completion_ids"] == choice["token_ids"]
    assert row["logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert row["completion_ids"][-1] == 2  # <|im_end|>


def text_of(documents: list[dict[str, Any]]) -> str:
    return "".join(
        part.get("text", "")
        for doc in documents
        for part in doc["candidates"][0]["content"]["parts"]
        if not part.get("thought")
    )


anyio = pytest.mark.anyio


# --- golden answers, in-process -------------------------------------------------------------


@anyio
async def test_generate_content_text_matches_golden_and_captures_ids(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)], "generationConfig": {"temperature": 0.5}}
    response = await post(harness, GENERATE, body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert_like(answer, golden("gemini", "generate_content_text.json"), VOLATILE)
    (row,) = await harness.rows()
    assert (row["api_type"], row["stream"], row["complete"]) == ("gemini", False, True)
    assert row["request"] == body
    chat = {"model": "policy", "messages": [{"role": "user", "content": QUESTION}]}
    assert row["engine_request"]["messages"] == chat["messages"]
    assert row["engine_request"]["temperature"] == 0.5
    assert row["engine_request"]["stream"] is False
    await assert_captured_like_direct(harness, row, {**chat, "temperature": 0.5})
    assert_usage(answer, row)
    assert "token_ids" not in response.text and "logprob" not in response.text


@anyio
async def test_generate_content_function_call_matches_golden(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)], "tools": TOOLS}
    response = await post(harness, GENERATE, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert_like(answer, golden("gemini", "generate_content_function_call.json"), VOLATILE)
    call = answer["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call["id"]
    (row,) = await harness.rows()
    assert row["finish_reason"] == "tool_calls"
    assert row["engine_request"]["tools"] == [CALCULATOR_CHAT_TOOL]
    chat = {"messages": row["engine_request"]["messages"], "tools": [CALCULATOR_CHAT_TOOL]}
    await assert_captured_like_direct(harness, row, chat)
    assert_usage(answer, row)


@anyio
async def test_multi_turn_function_response_extends_the_prompt(harness: Harness) -> None:
    contents: list[dict[str, Any]] = [user(QUESTION)]
    first = await post(harness, GENERATE, {"contents": contents, "tools": TOOLS})
    model_turn = first.json()["candidates"][0]["content"]
    call = model_turn["parts"][0]["functionCall"]
    contents.append(model_turn)
    response_part = {"name": "calculator", "id": call["id"], "response": {"result": 42}}
    contents.append({"role": "user", "parts": [{"functionResponse": response_part}]})
    second = await post(harness, GENERATE, {"contents": contents, "tools": TOOLS})
    assert second.status_code == 200, second.text
    parts = second.json()["candidates"][0]["content"]["parts"]
    assert parts == [{"text": 'ANSWER: {"result": 42}'}]
    turn1, turn2 = await harness.rows()
    assert turn2["engine_request"]["messages"] == [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "17 + 25"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": '{"result": 42}'},
    ]
    await assert_captured_like_direct(
        harness, turn2, {"messages": turn2["engine_request"]["messages"], "tools": TOOLS_CHAT}
    )
    history = turn1["prompt_ids"] + turn1["completion_ids"]
    assert turn2["prompt_ids"][: len(history)] == history
    assert [turn1["seq"], turn2["seq"]] == [0, 1]


@anyio
async def test_function_calls_without_ids_get_stable_generated_ids(harness: Harness) -> None:
    contents = [
        user(QUESTION),
        {
            "role": "model",
            "parts": [{"functionCall": {"name": "calculator", "args": {"x": 1}}}, {"text": ""}],
        },
        {
            "role": "function",
            "parts": [{"functionResponse": {"name": "calculator", "response": {"r": 1}}}],
        },
    ]
    for _ in range(2):
        response = await post(harness, GENERATE, {"contents": contents, "tools": TOOLS})
        assert response.status_code == 200, response.text
    first, second = await harness.rows()
    messages = first["engine_request"]["messages"]
    assert messages[1]["tool_calls"][0]["id"] == "call_1_0"
    assert messages[1]["content"] is None  # a stream's empty closing text changes nothing
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1_0", "content": '{"r": 1}'}
    assert second["engine_request"]["messages"] == messages
    assert second["prompt_ids"] == first["prompt_ids"]


@anyio
async def test_stream_sse_text_matches_golden_and_captures_ids(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)]}
    response = await harness.client.post(f"{STREAM}?alt=sse", json=body, headers=key(harness))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_documents(response.content)
    first, last = golden_events("stream_text.sse")
    assert len(events) == len("CALC: 17 + 25") + 1
    for event in events[:-1]:
        expected_text = event["candidates"][0]["content"]["parts"][0]["text"]
        first["candidates"][0]["content"]["parts"][0]["text"] = expected_text
        assert_like(event, first, VOLATILE)
    assert_like(events[-1], last, VOLATILE)
    assert text_of(events) == "CALC: 17 + 25"
    assert len({e["responseId"] for e in events}) == 1
    (row,) = await harness.rows()
    assert (row["api_type"], row["stream"], row["complete"]) == ("gemini", True, True)
    assert row["request"] == body
    assert row["engine_request"]["stream_options"] == {"include_usage": True}
    await assert_captured_like_direct(harness, row, {"messages": row["engine_request"]["messages"]})
    assert_usage(events[-1], row)


@anyio
async def test_stream_json_array_text(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)]}
    response = await harness.client.post(f"{STREAM}?key={harness.token}", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.content.startswith(b"[{") and response.content.endswith(b"}]")
    assert b"},\r\n{" in response.content
    elements = response.json()
    first, last = golden_events("stream_text.sse")
    assert_like(elements[-1], last, VOLATILE)
    assert set(elements[0]) == set(first)
    assert text_of(elements) == "CALC: 17 + 25"
    (row,) = await harness.rows()
    assert (row["stream"], row["complete"], row["finish_reason"]) == (True, True, "stop")
    await assert_captured_like_direct(harness, row, {"messages": row["engine_request"]["messages"]})
    assert_usage(elements[-1], row)


@anyio
async def test_stream_function_call_matches_golden(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)], "tools": TOOLS}
    response = await harness.client.post(f"{STREAM}?alt=sse", json=body, headers=key(harness))
    assert response.status_code == 200, response.text
    events = sse_documents(response.content)
    assert_like(events, golden_events("stream_function_call.sse"), VOLATILE)
    (row,) = await harness.rows()
    assert (row["stream"], row["complete"], row["finish_reason"]) == (True, True, "tool_calls")
    chat = {"messages": row["engine_request"]["messages"], "tools": TOOLS_CHAT}
    await assert_captured_like_direct(harness, row, chat)
    assert_usage(events[-1], row)


@anyio
async def test_count_tokens_asks_the_engine_and_logs_nothing(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)]}
    response = await post(harness, COUNT, body)
    assert response.status_code == 200, response.text
    direct = await harness.direct(
        "/tokenize", {"model": "fake-model", "messages": [{"role": "user", "content": QUESTION}]}
    )
    assert response.json() == {"totalTokens": direct["count"]}
    wrapped = {"generateContentRequest": {"model": "models/policy", **body, "tools": TOOLS}}
    with_tools = await harness.client.post(
        f"/r/{harness.token}/v1/models/policy:countTokens", json=wrapped
    )
    assert with_tools.json()["totalTokens"] > direct["count"]
    assert await harness.rows() == []
    assert harness.stats.requests == 0


# --- refusals -------------------------------------------------------------------------------


def assert_google_error(response: httpx.Response, status: int, name: str) -> str:
    """Google's error shape (as in the golden 400) with `status` and its canonical name."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    expected = golden("gemini", "error.json")
    expected["error"].update(code=status, status=name, message=document["error"]["message"])
    assert_like(document, expected, VOLATILE)
    message: str = document["error"]["message"]
    assert message
    return message


BAD_BODIES: dict[str, tuple[dict[str, Any], str]] = {
    "empty contents": ({"contents": []}, "contents"),
    "no contents": ({"generationConfig": {}}, "contents"),
    "file part": (
        {"contents": [{"role": "user", "parts": [{"fileData": {"fileUri": "gs://x"}}]}]},
        "fileData",
    ),
    "code part": (
        {"contents": [{"role": "user", "parts": [{"executableCode": {"code": "1"}}]}]},
        "executableCode",
    ),
    "search tool": ({"contents": [user("hi")], "tools": [{"googleSearch": {}}]}, "googleSearch"),
    "two candidates": (
        {"contents": [user("hi")], "generationConfig": {"candidateCount": 2}},
        "candidateCount",
    ),
    "cached content": ({"contents": [user("hi")], "cachedContent": "cachedContents/1"}, "cached"),
    "bad role": ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "role"),
    "orphan response": (
        {
            "contents": [
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}
            ]
        },
        "functionResponse",
    ),
    "audio": (
        {"contents": [{"parts": [{"inlineData": {"mimeType": "audio/wav", "data": "AA=="}}]}]},
        "audio/wav",
    ),
}


@anyio
@pytest.mark.parametrize("case", sorted(BAD_BODIES))
async def test_bad_requests_are_400_in_google_shape(harness: Harness, case: str) -> None:
    body, mentions = BAD_BODIES[case]
    response = await post(harness, GENERATE, body)
    assert mentions in assert_google_error(response, 400, "INVALID_ARGUMENT")
    assert await harness.rows() == []
    assert harness.stats.requests == 0


@anyio
async def test_malformed_json_unknown_action_and_no_key(harness: Harness) -> None:
    malformed = await harness.client.post(GENERATE, content=b"{not json", headers=key(harness))
    assert "JSON" in assert_google_error(malformed, 400, "INVALID_ARGUMENT")
    unknown = await post(harness, "/v1beta/models/policy:embedContent", {"contents": []})
    assert "embedContent" in assert_google_error(unknown, 404, "NOT_FOUND")
    no_action = await post(harness, "/v1/models/policy", {"contents": [user("hi")]})
    assert no_action.status_code in (404, 405)
    anonymous = await harness.client.post(GENERATE, json={"contents": [user("hi")]})
    assert_google_error(anonymous, 401, "UNAUTHENTICATED")
    counted = await harness.client.post(COUNT, json={"contents": [user("hi")]})
    assert_google_error(counted, 401, "UNAUTHENTICATED")
    assert await harness.rows() == []
    assert harness.stats.requests == 0


@anyio
async def test_engine_refusal_is_reshaped(harness: Harness) -> None:
    body = {"contents": [user(QUESTION)], "generationConfig": {"maxOutputTokens": 10**9}}
    response = await post(harness, GENERATE, body)
    assert "context length" in assert_google_error(response, 400, "INVALID_ARGUMENT")


# --- translation units ----------------------------------------------------------------------


def translate(body: dict[str, Any], action: str = "policy:generateContent") -> Translation:
    asked = FamilyRequest(rollout_id=uuid.uuid4(), path_params={"model_action": action})
    return gemini.to_chat(body, asked)


def test_request_translation_covers_config_schema_system_and_parts() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}, "minItems": "1"},
            "note": {"type": "STRING", "nullable": True, "example": "x"},
            "kind": {"type": "STRING", "enum": ["a", "b"], "format": "enum"},
        },
        "required": ["tags"],
    }
    body = {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "Look:"},
                    {"inline_data": {"mime_type": "image/png", "data": "iVBO"}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "Thinking", "thought": True, "thoughtSignature": "c2ln"},
                    {"text": "Hel"},
                    {"text": "lo"},
                ],
            },
            user("again"),
        ],
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "f", "parametersJsonSchema": {"type": "object"}},
                    {"name": "g"},
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {
            "temperature": 0.1,
            "topP": 0.9,
            "topK": 5,
            "maxOutputTokens": 7,
            "stopSequences": ["END"],
            "seed": 3,
            "presencePenalty": 0.2,
            "frequencyPenalty": 0.3,
            "responseMimeType": "application/json",
            "responseSchema": schema,
            "thinkingConfig": {"thinkingBudget": 0},
        },
        "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
    }
    translation = translate(body, "models/policy:streamGenerateContent")
    chat = translation.chat
    assert (translation.stream, translation.agent_model) == (True, "policy")
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
            ],
        },
        {"role": "assistant", "content": "Hello", "reasoning": "Thinking"},
        {"role": "user", "content": "again"},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {
            "type": "function",
            "function": {"name": "g", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "response",
            "schema": {
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "note": {"type": ["string", "null"]},
                    "kind": {"type": "string", "enum": ["a", "b"], "format": "enum"},
                },
                "required": ["tags"],
            },
        },
    }
    assert {
        k: chat[k]
        for k in (
            "temperature",
            "top_p",
            "top_k",
            "max_tokens",
            "stop",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "stream",
        )
    } == {
        "temperature": 0.1,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 7,
        "stop": ["END"],
        "seed": 3,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "stream": True,
    }
    assert chat["stream_options"] == {"include_usage": True}
    for mode, expected in (("AUTO", "auto"), ("ANY", "required"), ("NONE", "none")):
        config = {"functionCallingConfig": {"mode": mode}}
        assert (
            translate({"contents": [user("x")], "toolConfig": config}).chat["tool_choice"]
            == expected
        )
    plain_json = {"responseMimeType": "application/json"}
    chat = translate({"contents": [user("x")], "generationConfig": plain_json}).chat
    assert chat["response_format"] == {"type": "json_object"}
    assert translate({"contents": [user("x")], "systemInstruction": "S"}).chat["messages"][0] == {
        "role": "system",
        "content": "S",
    }


def test_unknown_action_in_to_chat_is_404() -> None:
    with pytest.raises(FamilyError) as caught:
        translate({"contents": [user("x")]}, "policy:predict")
    assert caught.value.status == 404


def test_function_response_output_is_the_tool_text_other_shapes_stay_json() -> None:
    """Google's convention `{"output": text}` is the tool's plain text; anything else is JSON."""
    call = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}, "id": "c1"}}]}
    for response, content in [
        ({"output": "42"}, "42"),
        ({"result": "42"}, '{"result": "42"}'),
        ({"output": {"v": 1}}, '{"output": {"v": 1}}'),
        ({"output": "42", "error": None}, '{"output": "42", "error": null}'),
    ]:
        answer = {"functionResponse": {"name": "f", "id": "c1", "response": response}}
        body = {"contents": [user("x"), call, {"role": "user", "parts": [answer]}]}
        messages = translate(body, "policy:generateContent").chat["messages"]
        assert messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": content}


def _translation(sse: bool) -> tuple[GeminiStream, Translation]:
    translation = Translation(chat={}, stream=True, agent_model="policy", context={"sse": sse})
    stream = gemini.stream(translation)
    assert isinstance(stream, GeminiStream)
    return stream, translation


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "token_ids": [7]}
    return {"id": "chatcmpl-1", "choices": [choice], **extra}


def test_stream_assembles_split_tool_arguments_and_reasoning() -> None:
    """Real vLLM splits a call's arguments over chunks: the agent gets the call whole, once."""
    stream, _ = _translation(sse=True)
    out = stream.chunk(chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]))
    assert out == b""
    out += stream.chunk(chunk({"reasoning": "Let me add."}))
    out += stream.chunk(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call-x",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expr'},
                    }
                ]
            }
        )
    )
    out += stream.chunk(
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ession": "1 + 2"}'}}]})
    )
    before_finish = sse_documents(out)
    assert [e["candidates"][0]["content"]["parts"] for e in before_finish] == [
        [{"text": "Let me add.", "thought": True}]
    ]
    out = stream.chunk(chunk({}, "tool_calls"))
    assert out == b""  # waits for the usage chunk
    out = stream.chunk(
        {
            "id": "chatcmpl-1",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        }
    )
    (last,) = sse_documents(out)
    assert last["candidates"][0] == {
        "content": {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "name": "calculator",
                        "args": {"expression": "1 + 2"},
                        "id": "call-x",
                    }
                }
            ],
        },
        "finishReason": "STOP",
        "index": 0,
    }
    assert last["usageMetadata"]["totalTokenCount"] == 7
    assert stream.done() == b""


def test_stream_without_usage_closes_at_done_and_counts_ids() -> None:
    stream, _ = _translation(sse=False)
    out = stream.chunk(chunk({"content": "Hi"}, prompt_token_ids=[1, 2]))
    out += stream.chunk(chunk({"content": "!"}, "length"))
    out += stream.done()
    elements = json.loads(out)
    assert [text_of([e]) for e in elements] == ["Hi", "!", ""]
    assert elements[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert elements[-1]["usageMetadata"] == {
        "promptTokenCount": 2,
        "candidatesTokenCount": 2,
        "totalTokenCount": 4,
    }
    assert stream.fail("late") == b""


@pytest.mark.parametrize("sse", [True, False])
def test_stream_errors_end_the_stream_in_google_shape(sse: bool) -> None:
    stream, _ = _translation(sse)
    out = stream.chunk(chunk({"content": "Hi"}))
    out += stream.chunk({"error": {"message": "boom", "type": "BadRequestError", "code": 400}})
    out += stream.chunk(chunk({"content": "ignored"}))
    out += stream.done()
    documents = sse_documents(out) if sse else json.loads(out)
    assert documents[-1] == {
        "error": {"code": 400, "message": "boom", "status": "INVALID_ARGUMENT"}
    }
    assert len(documents) == 2
    broken, _ = _translation(sse)
    tail = broken.fail("upstream inference server broke off the stream")
    documents = sse_documents(tail) if sse else json.loads(tail)
    assert documents == [
        {
            "error": {
                "code": 502,
                "status": "UNAVAILABLE",
                "message": "upstream inference server broke off the stream",
            }
        }
    ]


def test_render_reasoning_text_and_calls() -> None:
    data = {
        "id": "chatcmpl-9",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Sure.",
                    "reasoning_content": "hmm",
                    "tool_calls": [
                        {
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": [1]}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
        "prompt_token_ids": [1, 2, 3, 4, 5],
    }
    translation = Translation(chat={}, stream=False, agent_model="policy")
    answer = gemini.render(data, translation)
    assert answer["candidates"][0]["content"]["parts"] == [
        {"text": "hmm", "thought": True},
        {"text": "Sure."},
        {"functionCall": {"name": "f", "args": {"a": [1]}, "id": "t1"}},
    ]
    assert answer["responseId"] == "chatcmpl-9" and answer["modelVersion"] == "policy"
    assert "prompt_token_ids" not in json.dumps(answer)


# --- Google's SDK over real sockets ---------------------------------------------------------


# The fake engine: one process (its CLI) for the module; a fresh proxy and sink for each test.
fake_engine, served = family_support.socket_fixtures()


def sdk_client(url: str, token: str) -> genai.Client:
    from google import genai
    from google.genai import types

    return genai.Client(api_key=token, http_options=types.HttpOptions(base_url=url, timeout=20_000))


def sdk_config() -> types.GenerateContentConfig:
    from google.genai import types

    declaration = types.FunctionDeclaration(
        name="calculator",
        description="Evaluate an arithmetic expression.",
        parameters=types.Schema(
            type=types.Type.OBJECT,
            properties={"expression": types.Schema(type=types.Type.STRING)},
            required=["expression"],
        ),
    )
    return types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[declaration])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        temperature=0.0,
    )


def function_response(call: types.FunctionCall, result: Any) -> types.Content:
    from google.genai import types

    part = types.Part(
        function_response=types.FunctionResponse(
            name=call.name, id=call.id, response={"result": result}
        )
    )
    return types.Content(role="user", parts=[part])


def test_google_sdk_function_call_loop(served: tuple[str, MemoryCallSink]) -> None:
    from google.genai import types

    url, sink = served
    rollout = uuid.uuid4()
    client = sdk_client(url, issue_rollout_token(SECRET, rollout, 600))
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    first = client.models.generate_content(model="policy", contents=contents, config=sdk_config())
    assert first.function_calls and len(first.function_calls) == 1
    call = first.function_calls[0]
    assert (call.name, call.args) == ("calculator", {"expression": "17 + 25"})
    assert call.id and first.model_version == "policy"
    assert first.candidates and first.candidates[0].finish_reason == types.FinishReason.STOP
    assert first.candidates[0].content is not None
    contents += [first.candidates[0].content, function_response(call, 42)]
    second = client.models.generate_content(model="policy", contents=contents, config=sdk_config())
    assert second.text == 'ANSWER: {"result": 42}'
    assert second.usage_metadata is not None and second.usage_metadata.total_token_count
    count = client.models.count_tokens(model="policy", contents=contents)
    assert count.total_tokens and count.total_tokens > 0
    rows = wait_for_rows(sink, 2)
    assert len(rows) == 2
    assert all(r["api_type"] == "gemini" and r["rollout_id"] == rollout for r in rows)
    assert all(r["complete"] and r["prompt_ids"] and r["completion_ids"] for r in rows)
    assert all(len(r["logprobs"]) == len(r["completion_ids"]) for r in rows)
    assert rows[1]["engine_request"]["messages"][2]["tool_call_id"] == call.id
    assert_one_merged_sample(rows)


def streamed_parts(chunk: types.GenerateContentResponse) -> list[types.Part]:
    """The parts of a streamed chunk's first candidate (a client keeps them all, in order)."""
    if not chunk.candidates or chunk.candidates[0].content is None:
        return []
    return list(chunk.candidates[0].content.parts or [])


def test_google_sdk_streaming_function_call_loop(served: tuple[str, MemoryCallSink]) -> None:
    from google.genai import types

    url, sink = served
    client = sdk_client(url, issue_rollout_token(SECRET, uuid.uuid4(), 600))
    question = "Please compute (3 + 4) * 5."
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text=question)])]
    chunks = list(
        client.models.generate_content_stream(
            model="policy", contents=contents, config=sdk_config()
        )
    )
    parts = [p for c in chunks for p in streamed_parts(c)]
    calls = [p.function_call for p in parts if p.function_call]
    assert len(calls) == 1 and calls[0].args == {"expression": "(3 + 4) * 5"}
    contents += [types.Content(role="model", parts=parts), function_response(calls[0], 35)]
    text = "".join(
        c.text or ""
        for c in client.models.generate_content_stream(
            model="policy", contents=contents, config=sdk_config()
        )
    )
    assert text == 'ANSWER: {"result": 35}'
    rows = wait_for_rows(sink, 2)
    assert len(rows) == 2 and all(r["stream"] and r["complete"] for r in rows)
    assert [r["finish_reason"] for r in rows] == ["tool_calls", "stop"]
    assert_one_merged_sample(rows)


def test_google_sdk_sees_google_errors(served: tuple[str, MemoryCallSink]) -> None:
    from google.genai import errors as genai_errors
    from google.genai import types

    url, sink = served
    client = sdk_client(url, "not-a-rollout-token")
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model="policy", contents=QUESTION)
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    good = sdk_client(url, issue_rollout_token(SECRET, uuid.uuid4(), 600))
    bad_part = types.Part(file_data=types.FileData(file_uri="gs://b/f.pdf", mime_type="a/b"))
    with pytest.raises(genai_errors.ClientError) as refused:
        good.models.generate_content(
            model="policy", contents=[types.Content(role="user", parts=[bad_part])]
        )
    assert refused.value.code == 400 and "fileData" in (refused.value.message or "")
    time.sleep(0.05)
    assert sink.rows == []
