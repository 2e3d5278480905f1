"""(f) What token-in/token-out costs the proxy per chat call, in process, next to the chat path.

Under TITO (`polar_mq.proxy.tito`) a chat call that extends the rollout's last turn costs the
proxy: comparing its messages with that turn (a hash of the history), one `/tokenize` request to
the engine for the new messages (the client side only: building, sending and parsing it; the
engine, the fake vLLM in a process of its own, tokenizes on its own CPU), building the completions
body, turning the completion back into a chat answer and keeping the turn. This measures it on a
conversation of `--turns` turns (each turn: a tool call and its result, about 60 tokens) against
the chat path's own per-call work on the same answer (capture, strip, serialize), with TITO off
(`proxy_tito=off`: none of it runs) and on. The `/tokenize` request alone is measured through
both clients a backend has: its own keep-alive pool (what the proxy uses) and its httpx client
(used before). Medians of `--repeats` timings.

    .venv/bin/python -m bench.proxy.tito [--calls 500] [--repeats 5] [--turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.proxy.backends import Backend
from polar_mq.proxy.engines import vllm
from polar_mq.proxy.engines.base import CHAT, COMPLETIONS
from polar_mq.proxy.store.record import new_call
from polar_mq.proxy.tito.history import Turn, digest, normalize, tools_digest
from polar_mq.proxy.tito.route import Tito
from polar_mq.proxy.tito.store import LastTurn, LocalTurns
from polar_mq.proxy.tito.tool_parsers import get_parser

TOKENS = 32
PROMPT_TOKENS_PER_TURN = 60
HEADERS = {"content-type": "application/json"}
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You compute. " * 20}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"What is {i} + {i}? Use the tool."})
        call = {"id": f"c{i}", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": str(2 * i)},
        ]
    return messages


def _completion(prompt_len: int) -> dict[str, Any]:
    text = "ANSWER: " + "x" * (TOKENS - 9)
    choice = {
        "index": 0,
        "text": text,
        "logprobs": {"token_logprobs": [-0.1] * TOKENS, "tokens": ["x"] * TOKENS},
        "finish_reason": "stop",
        "token_ids": list(range(TOKENS)),
        "prompt_token_ids": list(range(prompt_len)),
    }
    usage = {"prompt_tokens": prompt_len, "completion_tokens": TOKENS}
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [choice],
        "usage": usage,
    }


def _chat_answer(prompt_len: int) -> dict[str, Any]:
    message = {"role": "assistant", "content": "ANSWER: " + "x" * (TOKENS - 9), "reasoning": None}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": [{"token": "x", "logprob": -0.1}] * TOKENS},
        "finish_reason": "stop",
        "token_ids": list(range(TOKENS)),
    }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice],
        "prompt_token_ids": list(range(prompt_len)),
    }


async def _measure(url: str, calls: int, repeats: int, turns: int) -> dict[str, float]:
    messages = _conversation(turns)
    body = {"model": "agent", "messages": messages, "tools": TOOLS}
    prompt_len = PROMPT_TOKENS_PER_TURN * turns
    chat_answer, completion = _chat_answer(prompt_len), _completion(prompt_len)
    previous = messages[:-2]
    turn = Turn(
        len(previous), digest(previous, TOOLS), tools_digest(TOOLS), normalize(messages[-2])
    )
    last = LastTurn(turn, list(range(prompt_len - 60)))
    rollout = uuid.uuid4()
    tito = Tito(LocalTurns(), get_parser("hermes"))
    engine = Backend("engine", url, ())
    figures: dict[str, list[float]] = {
        name: [] for name in ("chat", "tito", "history", "tokenize", "tokenize_httpx")
    }
    asked = orjson.dumps({"model": "m", "messages": messages[-1:], "add_generation_prompt": True})
    try:
        for _ in range(repeats):
            started = time.process_time()
            for _ in range(calls):
                upstream, view = vllm.rewrite_request(CHAT, body, "m")
                vllm.extract_response(CHAT, chat_answer)
                orjson.dumps(vllm.visible(chat_answer, view))
            figures["chat"].append(1e6 * (time.process_time() - started) / calls)
            started = time.process_time()
            for _ in range(calls):
                await tito.store.save(rollout, 1, last)
                upstream, view = vllm.rewrite_request(CHAT, body, "m")
                call = new_call(rollout, 1, CHAT, body, upstream, view)
                sent = await tito.prepare(engine, call, upstream)
                assert sent is not None and call.translated is not None, call.tito_fallback
                capture = vllm.extract_response(COMPLETIONS, completion)
                answer = call.translated.family.render(completion, call.translated.translation)
                assert call.on_answered is not None
                await call.on_answered(capture, completion)
                orjson.dumps(answer)
            figures["tito"].append(1e6 * (time.process_time() - started) / calls)
            started = time.process_time()
            for _ in range(calls):
                digest(messages, TOOLS)
            figures["history"].append(1e6 * (time.process_time() - started) / calls)
            started = time.process_time()
            for _ in range(calls):
                await engine.post_small("/tokenize", asked)
            figures["tokenize"].append(1e6 * (time.process_time() - started) / calls)
            started = time.process_time()
            for _ in range(calls):
                reply = await engine.client.post("/tokenize", content=asked, headers=HEADERS)
                reply.raise_for_status()
            figures["tokenize_httpx"].append(1e6 * (time.process_time() - started) / calls)
    finally:
        await engine.aclose()
    return {name: statistics.median(values) for name, values in figures.items()}


def measure(calls: int = 500, repeats: int = 5, turns: int = 10) -> dict[str, float]:
    """Median µs of CPU per call: "chat" (the chat path's capture work), "tito" (the same call
    token-in: TITO's work in its place, with the turn check and the tokenize), two parts of the
    latter ("history": hashing the messages; "tokenize": a `/tokenize` request through the own
    pool), and the same request through the backend's httpx client ("tokenize_httpx")."""
    with tempfile.TemporaryDirectory(prefix="bench-tito-") as logs:
        port = free_port()
        argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm"]
        argv += ["--port", str(port), "--model", "m"]  # the model `rewrite_request` names
        engine = ManagedProcess("fake-engine", argv, dict(os.environ), Path(logs)).start()
        try:
            url = f"http://127.0.0.1:{port}"
            engine.wait_http(f"{url}/health")
            return asyncio.run(_measure(url, calls, repeats, turns))
        finally:
            engine.stop()


def render(figures: dict[str, float], turns: int) -> list[str]:
    chat, tito = figures["chat"], figures["tito"]
    head = f"(f) token-in/token-out in process, CPU per call (µs; {turns}-turn history)"
    return [
        head,
        f"  TITO off (chat path) {chat:.0f};  TITO on {tito:.0f} (+{tito - chat:.0f})",
        f"  of which: history hash {figures['history']:.0f}, "
        f"/tokenize request (client side) {figures['tokenize']:.0f} "
        f"(through the httpx client: {figures['tokenize_httpx']:.0f})",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.tito", description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args(argv)
    print("\n".join(render(measure(args.calls, args.repeats, args.turns), args.turns)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
