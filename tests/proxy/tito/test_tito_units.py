"""TITO's pieces: tool-call parsing, history comparison, the stored turn, the boot checks."""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson
import pytest
from proxy_support import proxy_settings

from polar_mq.proxy import create_proxy_app
from polar_mq.proxy.engines.base import View
from polar_mq.proxy.tito.answer import Answerer, TitoStream
from polar_mq.proxy.tito.history import (
    FIRST_CALL,
    HISTORY_REWRITTEN,
    NO_NEW_MESSAGES,
    REPLY_DROPPED,
    REPLY_EDITED,
    TOOLS_CHANGED,
    Turn,
    digest,
    hashed,
    new_messages,
    normalize,
    tools_digest,
)
from polar_mq.proxy.tito.store import LastTurn, LocalTurns, decode, encode
from polar_mq.proxy.tito.tool_parsers import get_parser, parse_hermes


def test_hermes_reads_tool_calls_and_the_text_before_them() -> None:
    text = (
        'Let me.\n<tool_call>\n{"name": "calc", "arguments": {"e": "1+1", "u": "é"}}\n</tool_call>'
    )
    parsed = parse_hermes(text + '<tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    assert parsed.content == "Let me.\n"
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["calc", "ls"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"e": "1+1", "u": "é"}
    assert "é" in parsed.tool_calls[0]["function"]["arguments"]  # not \\u-escaped, as vLLM
    assert parse_hermes(text).tool_calls[0]["id"].startswith("chatcmpl-tool-")


@pytest.mark.parametrize(
    "text", ["plain", "<tool_call>{not json}</tool_call>", '<tool_call>{"x": 1}</tool_call>']
)
def test_text_that_is_no_tool_call_stays_content(text: str) -> None:
    parsed = parse_hermes(text)
    assert parsed.content == text and parsed.tool_calls == []


def test_an_unknown_parser_is_named() -> None:
    with pytest.raises(ValueError, match="hermes"):
        get_parser("nope")


def test_an_sdk_echo_of_the_reply_normalizes_to_the_reply() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    got = {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": None}
    echoed = {**got, "refusal": None, "annotations": [], "audio": None, "function_call": None}
    assert normalize(echoed) == normalize(got)
    assert normalize({"role": "assistant", "content": [{"type": "text", "text": "a"}]}) == (
        normalize({"role": "assistant", "content": "a"})
    )
    assert normalize({**got, "content": "x"}) != normalize(got)
    text = {"role": "assistant", "content": "```bash\nls\n```"}
    litellm = {  # litellm's `Message.model_dump()`, as mini-swe-agent re-sends it
        **text,
        "tool_calls": None,
        "function_call": None,
        "provider_specific_fields": {"reasoning": None},
        "refusal": None,
    }
    assert normalize(litellm) == normalize(text)


def test_which_turns_extend_the_last() -> None:
    sent = [{"role": "user", "content": "q"}]
    reply = {"role": "assistant", "content": "a"}
    turn = Turn(1, digest(sent, None), tools_digest(None), normalize(reply))
    new = {"role": "user", "content": "more"}

    def added(messages: list[Any], tools: Any = None) -> Any:
        return new_messages(turn, hashed(messages, tools, turn.n_messages))

    assert added([*sent, reply, new]) == [new]
    assert new_messages(None, hashed(sent, None)) == FIRST_CALL
    assert added([*sent, reply]) == NO_NEW_MESSAGES
    assert added([{"role": "user", "content": "Q"}, reply, new]) == HISTORY_REWRITTEN
    assert added([*sent, {**reply, "content": "b"}, new]) == REPLY_EDITED
    assert added([*sent, new]) == REPLY_DROPPED  # the reply left out, a message in its place
    assert added([*sent, new, new]) == REPLY_DROPPED
    assert added([*sent, reply, new], [{"type": "function"}]) == TOOLS_CHANGED
    assert added(sent) == HISTORY_REWRITTEN


def test_one_pass_hashes_the_prefix_as_the_whole_of_it() -> None:
    messages = [{"role": "user", "content": str(i)} for i in range(5)]
    for at in range(6):
        assert hashed(messages, None, at).prefix == digest(messages[:at], None)
    assert digest(messages[:2], None) != digest(messages[:3], None)
    assert digest(messages, None) != digest(messages, [{"type": "function"}])


@pytest.mark.anyio
async def test_a_stored_turn_round_trips() -> None:
    turn = Turn(3, b"m" * 16, b"t" * 16, {"role": "assistant", "content": "é"})
    last = LastTurn(turn, [1, 2, 70000, 2])
    assert decode(encode(last)) == last
    local = LocalTurns(max_rollouts=1)
    first, second = uuid.uuid4(), uuid.uuid4()
    await local.save(first, 1, last)
    await local.save(second, 1, last)
    assert await local.load(first, 1) is None and await local.load(second, 1) == last


def test_tito_on_with_an_engine_without_token_prompts_is_refused_at_boot() -> None:
    with pytest.raises(ValueError, match="proxy_tito=on"):
        create_proxy_app(proxy_settings(proxy_tito="on", upstream_engine="generic"))
    create_proxy_app(proxy_settings(proxy_tito="auto", upstream_engine="generic"))  # off there
    create_proxy_app(proxy_settings(proxy_tito="on", upstream_engine="sglang"))  # /generate
    with pytest.raises(ValueError, match="proxy_tito_backends"):
        create_proxy_app(
            proxy_settings(upstream_engine="generic", proxy_tito_backends={"http://b:1": "on"})
        )
    with pytest.raises(ValueError, match="tool parser"):
        create_proxy_app(proxy_settings(proxy_tito="on", proxy_tito_tool_parser="nope"))


def _completion_chunks(text: str, finish: str = "stop") -> list[dict[str, Any]]:
    chunks = []
    for i, char in enumerate(text):
        choice: dict[str, Any] = {"index": 0, "text": char, "token_ids": [i]}
        choice["finish_reason"] = finish if i == len(text) - 1 else None
        if i == 0:
            choice["prompt_token_ids"] = [1, 2]
        chunks.append({"id": "cmpl-1", "model": "m", "created": 1, "choices": [choice]})
    return chunks


def _streamed(text: str, tools: bool) -> tuple[list[Any], TitoStream]:
    view = View("chat", "agent", False, False, False, False)
    stream = TitoStream(Answerer(view, get_parser("hermes") if tools else None))
    raw = b"".join(stream.chunk(c) for c in _completion_chunks(text)) + stream.done()
    events = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert raw.endswith(b"data: [DONE]\n\n")
    return events, stream


def test_a_stream_sends_text_then_whole_tool_calls() -> None:
    call = '<tool_call>\n{"name": "calc", "arguments": {"e": "1<2"}}\n</tool_call>'
    events, stream = _streamed("Let me see: 1 < 2." + call, tools=True)
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == "Let me see: 1 < 2."
    (calls,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"] == {"name": "calc", "arguments": '{"e": "1<2"}'}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(e["model"] == "agent" and e["id"] == "chatcmpl-1" for e in events)
    assert "prompt_token_ids" not in events[0]  # the agent did not ask for ids
    sent = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    assert stream.reply == {
        "role": "assistant",
        "content": "Let me see: 1 < 2.",
        "tool_calls": sent,
    }


def test_a_stream_without_tools_is_all_text() -> None:
    events, stream = _streamed("<tool_call> is just text here", tools=False)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == "<tool_call> is just text here"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert stream.reply == {"role": "assistant", "content": text}
