"""(e) What an API family's translation costs per call, in process, next to the chat relay.

The load runs of (a)/(b) are dominated by the proxy's request handling and call logging, and on a
shared 2-core machine their per-call CPU moves by tens of percent between repeats; the family
layer's own cost is far below that noise. This measures it directly on the same engine answer: a
non-streamed call (chat: capture + strip + serialize; a family: capture + `render` + serialize,
plus `to_chat` of the request) and a 32-chunk stream (chat: `SseRelay` with capture and strip; a
family: the same relay driving the family's `StreamTranslator`). Medians of `--repeats` timings.

    .venv/bin/python -m bench.proxy.families [--calls 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from polar_mq.proxy.apis import anthropic, gemini, responses
from polar_mq.proxy.apis.base import FamilyRequest
from polar_mq.proxy.apis.response_store import ResponseStore
from polar_mq.proxy.engines import vllm
from polar_mq.proxy.engines.base import CHAT
from polar_mq.proxy.sse import SseRelay

TOKENS = 32
QUESTION = "What is 1 + 2 + 3 + 4 + 5 + 6 + 7?"
BODIES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "messages": (
        anthropic,
        {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": QUESTION}]},
        {},
    ),
    "responses": (
        responses,
        {"model": "gpt", "input": QUESTION, "store": False},
        {},
    ),
    "gemini": (
        gemini,
        {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]},
        {"model_action": "gemini:generateContent"},
    ),
}


def _answer() -> dict[str, Any]:
    """A vLLM chat answer of 32 tokens with ids and logprobs (what the engine layer asked)."""
    content = [{"token": "x", "logprob": -0.1, "bytes": [120], "top_logprobs": []}] * TOKENS
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "x" * TOKENS, "reasoning": None},
        "logprobs": {"content": content},
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": list(range(TOKENS)),
    }
    usage = {"prompt_tokens": 30, "completion_tokens": TOKENS, "total_tokens": 30 + TOKENS}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "fake-model",
        "choices": [choice],
        "usage": usage,
        "prompt_token_ids": list(range(30)),
    }


def _stream_bytes() -> bytes:
    """The engine's SSE stream of the same answer, one token per chunk."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-model"}
    events: list[dict[str, object]] = [
        {
            **head,
            "prompt_token_ids": list(range(30)),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    ]
    for i in range(TOKENS):
        logprobs = {"content": [{"token": "x", "logprob": -0.1, "bytes": [120]}]}
        choice = {
            "index": 0,
            "delta": {"content": "x"},
            "logprobs": logprobs,
            "finish_reason": "stop" if i == TOKENS - 1 else None,
            "token_ids": [i],
        }
        events.append({**head, "choices": [choice]})
    usage = {"prompt_tokens": 30, "completion_tokens": TOKENS, "total_tokens": 30 + TOKENS}
    events.append({**head, "choices": [], "usage": usage})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _chat_json(answer: dict[str, Any]) -> Callable[[], object]:
    _, view = vllm.rewrite_request(CHAT, {"model": "agent", "messages": []}, "fake-model")

    def call() -> object:
        vllm.extract_response(CHAT, answer)
        return orjson.dumps(vllm.visible(answer, view))

    return call


def _family_json(name: str, answer: dict[str, Any]) -> Callable[[], object]:
    family, body, params = BODIES[name]
    asked = FamilyRequest(uuid.uuid4(), path_params=params, responses=ResponseStore())

    def call() -> object:
        translation = family.to_chat(body, asked)
        vllm.rewrite_request(CHAT, translation.chat, "fake-model")
        vllm.extract_response(CHAT, answer)
        return orjson.dumps(family.render(answer, translation))

    return call


def _pieces(raw: bytes, size: int = 512) -> Iterator[bytes]:
    for start in range(0, len(raw), size):
        yield raw[start : start + size]


def _chat_stream(raw: bytes) -> Callable[[], object]:
    _, view = vllm.rewrite_request(CHAT, {"model": "agent", "messages": []}, "fake-model")

    def call() -> object:
        capture = vllm.stream_capture(CHAT)

        def on_event(chunk: dict[str, Any]) -> None:
            capture.feed(chunk)
            vllm.strip(chunk, view, False)

        relay = SseRelay(on_event)
        out = [relay.feed(piece) for piece in _pieces(raw)]
        return out, capture.result()

    return call


def _family_stream(name: str, raw: bytes) -> Callable[[], object]:
    family, body, params = BODIES[name]
    asked = FamilyRequest(uuid.uuid4(), path_params=params, responses=ResponseStore())

    def call() -> object:
        translation = family.to_chat({**body, "stream": True}, asked)
        vllm.rewrite_request(CHAT, translation.chat, "fake-model")
        capture = vllm.stream_capture(CHAT)
        translator = family.stream(translation)
        relay = SseRelay(capture.feed, render=translator.chunk, on_done=translator.done)
        out = [relay.feed(piece) for piece in _pieces(raw)]
        return out, capture.result()

    return call


def _median_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            call()
        timings.append(1e6 * (time.process_time() - started) / calls)
    return statistics.median(timings)


def measure(calls: int = 2000, repeats: int = 5) -> dict[str, dict[str, float]]:
    """Median µs of CPU per call: {"json"|"stream": {"chat"|family: µs}}."""
    answer, raw = _answer(), _stream_bytes()
    figures: dict[str, dict[str, float]] = {"json": {}, "stream": {}}
    figures["json"]["chat"] = _median_us(_chat_json(answer), calls, repeats)
    figures["stream"]["chat"] = _median_us(_chat_stream(raw), calls, repeats)
    for name in BODIES:
        figures["json"][name] = _median_us(_family_json(name, answer), calls, repeats)
        figures["stream"][name] = _median_us(_family_stream(name, raw), calls, repeats)
    return figures


def render(figures: dict[str, dict[str, float]]) -> list[str]:
    lines = ["(e) translation in process, CPU per call (µs; same engine answer, 32 tokens)"]
    for mode, label in (("json", "non-streaming"), ("stream", "streaming")):
        chat = figures[mode]["chat"]
        cells = [f"chat relay {chat:.0f}"] + [
            f"{name} {us:.0f} (+{us - chat:.0f}, {us / chat:.2f}x)"
            for name, us in figures[mode].items()
            if name != "chat"
        ]
        lines.append(f"  {label:<16}" + ";  ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.families")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print("\n".join(render(measure(args.calls, args.repeats))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
