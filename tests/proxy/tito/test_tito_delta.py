"""Delta rendering (hypothesis): any extension of any history gives an exact prefix.

For a conversation H, the reply R the model sampled and any new messages A, the token prompt
(ids of H's prompt + R's sampled ids + the delta) must start with exactly what was sampled, and
with a template that renders history stably (the fake's ChatML) equal the ids the chat path gives
H + R + A: the delta adds what the template adds, nothing else, whether the reply ended with the
end-of-turn token or was cut off by max_tokens.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mq.proxy.backends import Backend
from polar_mq.proxy.tito.delta import BASE, DeltaRenderer, boundary
from polar_mq.testing.fake_tokenizer import IM_END, encode, render_chat, tool_call_markup
from polar_mq.testing.fake_vllm import create_fake_vllm_app

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@st.composite
def assistant(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"role": "assistant", "content": draw(texts)}
    arguments = json.dumps({"x": draw(texts)})
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def other(role: str) -> Any:
    return st.builds(lambda text: {"role": role, "content": text}, texts)


turns = st.one_of(other("user"), other("tool"), assistant())
added_turns = st.lists(st.one_of(other("user"), other("tool")), min_size=1, max_size=4)


def sampled(reply: dict[str, Any]) -> str:
    """The text the model generated for `reply` (the fake renders it back the same way)."""
    text = reply.get("content") or ""
    for call in reply.get("tool_calls") or ():
        text += tool_call_markup(call["function"]["name"], call["function"]["arguments"])
    return text


async def token_prompt(context: list[int], added: list[Any], tools: Any) -> list[int]:
    transport = httpx.ASGITransport(create_fake_vllm_app())
    engine = Backend("fake", "http://fake", (), transport=transport)
    try:
        return await DeltaRenderer().prompt(engine, "fake-model", context, added, tools)
    finally:
        await engine.aclose()


@settings(max_examples=60, deadline=None)
@given(
    system=st.one_of(st.none(), texts),
    history=st.lists(turns, max_size=5),
    question=texts,
    reply=assistant(),
    added=added_turns,
    cut=st.booleans(),
    tools=st.sampled_from([None, TOOLS]),
)
def test_any_extension_gives_the_chat_paths_ids(
    system: str | None,
    history: list[Any],
    question: str,
    reply: dict[str, Any],
    added: list[Any],
    cut: bool,
    tools: Any,
) -> None:
    head = [] if system is None else [{"role": "system", "content": system}]
    messages = [*head, *history, {"role": "user", "content": question}]
    prompt = encode(render_chat(messages, tools))
    completion = encode(sampled(reply)) + ([] if cut else [IM_END])  # cut: max_tokens hit
    context = prompt + completion
    built = asyncio.run(token_prompt(context, added, tools))
    assert built[: len(context)] == context
    assert built == encode(render_chat([*messages, reply, *added], tools))


def test_the_boundary_adds_only_what_was_not_sampled() -> None:
    tail = [IM_END, 13]
    assert boundary([5, 6, IM_END], tail) == [13]
    assert boundary([5, 6], tail) == [IM_END, 13]
    assert boundary([5, IM_END, 13], tail) == []
    assert BASE[-1]["role"] == "assistant"
