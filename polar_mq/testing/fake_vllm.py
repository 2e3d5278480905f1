"""A fast, in-process vLLM 0.32 look-alike: the upstream for the bulk of the proxy and e2e tests.

It speaks the same HTTP API and returns the same fields as the real server (see `fake_responses`),
tokenizes with a byte tokenizer and answers with a scripted calculator policy, so tests can assert
exact token ids, logprobs and answers without a model. Inject it with `httpx.ASGITransport`, or
serve it: `python -m polar_mq.testing.fake_vllm --port 8011 [--ttft-ms 20 --token-delay-ms 5]`.
`app.state.stats` counts what reached it (e.g. to prove a refused call was never forwarded).

LoRA adapters load and unload at runtime as on vLLM with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`
(`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, the same answers and errors); a call naming a
loaded adapter is served by it, and an adapter shifts every logprob by `ADAPTER_SHIFT` (the token
ids stay), so a test can tell which weights served a call. `fail_loads` makes loads fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar_mq.testing.fake_policy import Reply, chat_reply, completion_text
from polar_mq.testing.fake_requests import (
    MAX_LOGPROBS,
    BadRequest,
    error_response,
    json_response,
    parse_prompts,
    take_int,
)
from polar_mq.testing.fake_responses import (
    Options,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
)
from polar_mq.testing.fake_sampling import sample
from polar_mq.testing.fake_tokenizer import decode, encode, parse_chat, render_chat
from polar_mq.testing.scripted_policy import Policy, load_policy

ADAPTER_SHIFT = -0.5
"""Added to every logprob of a call served by a LoRA adapter."""
ADAPTER_CONFIG = "adapter_config.json"
THOUGHT = "<think>\nLet me work this out.\n</think>\n"
"""What the `thinking` fake thinks before every reply."""


@dataclass
class FakeStats:
    """What reached the fake: generation requests, per-path hits, and how streams ended."""

    requests: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    last_request: dict[str, Any] | None = None
    streams_finished: int = 0
    streams_aborted: int = 0
    generations_cancelled: int = 0
    """Non-streaming generations abandoned by the caller before they finished."""
    models: Counter[str] = field(default_factory=Counter)
    """Generations per model that served them (the base model or an adapter's name)."""
    events: list[tuple[str, str]] = field(default_factory=list)
    """In order: ("load" | "unload", adapter) and ("serve", model) for each generation."""


class FakeVllm:
    """The route handlers, holding the model name, the delays and the stats."""

    def __init__(
        self,
        model: str,
        ttft_s: float,
        token_delay_s: float,
        max_model_len: int,
        script: Policy | None = None,
        thinking: bool = False,
    ):
        self.model = model
        self.script = script
        self.thinking = thinking
        """A reasoning model: every reply opens with a `<think>` block, and the chat template
        drops earlier turns' thinking from the history (as Qwen3's does)."""
        self.ttft_s = ttft_s
        self.token_delay_s = token_delay_s
        self.max_model_len = max_model_len
        self.stats = FakeStats()
        self.adapters: dict[str, str] = {}
        """Loaded LoRA adapters: lora_name → lora_path."""
        self.fail_loads = False
        """Every adapter load fails (HTTP 500), as when the engine cannot read the adapter."""
        self.held = False
        """While true, a non-streamed generation that has waited its pacing waits on: a test
        keeps calls in flight for as long as it needs, whatever the machine's load, then lets
        them finish by setting it back (read from the server's thread; a bool is atomic)."""

    async def _body(self, request: Request) -> dict[str, Any]:
        self.stats.paths[request.url.path] += 1
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model and model not in self.adapters:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "model")
        return body

    def _served_by(self, body: dict[str, Any]) -> str:
        """The model serving a generation (recorded); an adapter's name when one is named."""
        model = body.get("model")
        served = model if isinstance(model, str) and model in self.adapters else self.model
        self.stats.models[served] += 1
        self.stats.events.append(("serve", served))
        return served

    def _shift(self, served: str, chunks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The adapter's mark on its output: every logprob moved by `ADAPTER_SHIFT`."""
        for chunk in chunks:
            yield _shifted(chunk, ADAPTER_SHIFT) if served != self.model else chunk

    def _options(self, body: dict[str, Any], logprobs: int | None, n: int) -> Options:
        stream_options = body.get("stream_options") or {}
        model = body.get("model")
        return Options(
            model=model if isinstance(model, str) and model in self.adapters else self.model,
            want_ids=bool(body.get("return_token_ids")),
            logprobs=logprobs,
            n=n,
            include_usage=bool(body.get("stream") and stream_options.get("include_usage")),
        )

    def _budget(self, body: dict[str, Any], prompt_len: int, default: int | None) -> int:
        room = self.max_model_len - prompt_len
        max_tokens = take_int(body, "max_completion_tokens", None, 1, 1 << 30)
        max_tokens = take_int(body, "max_tokens", max_tokens or default, 1, 1 << 30)
        if room <= 0 or (max_tokens is not None and max_tokens > room):
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt"
                f" has {prompt_len} and up to {max_tokens} were requested."
            )
        return room if max_tokens is None else max_tokens

    async def chat(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            self.stats.requests += 1
            self.stats.last_request = body
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("`messages` must be a non-empty list", param="messages")
            if not all(isinstance(m, dict) for m in messages):
                raise BadRequest("each message must be an object", param="messages")
            top = take_int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
            if top is not None and not body.get("logprobs"):
                raise BadRequest("when using `top_logprobs`, `logprobs` must be set to true")
            tools = body.get("tools") if body.get("tool_choice") != "none" else None
            add_prompt = body.get("add_generation_prompt", True) is not False
            prompt_ids = encode(
                render_chat(messages, tools, add_prompt, strip_thinking=self.thinking)
            )
            budget = self._budget(body, len(prompt_ids), None)
            logprobs = (top or 0) if body.get("logprobs") else None
            opts = self._options(body, logprobs, take_int(body, "n", 1, 1, 16) or 1)
        except BadRequest as exc:
            return error_response(exc)
        result = sample(self._reply(messages, tools), budget)
        served = self._served_by(body)
        if body.get("stream"):
            return self._stream(self._shift(served, chat_chunks(prompt_ids, result, opts)))
        await self._wait(len(result.token_ids))
        (answer,) = self._shift(served, [chat_response(prompt_ids, result, opts)])
        return json_response(answer)

    async def completions(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            self.stats.requests += 1
            self.stats.last_request = body
            prompts = parse_prompts(body.get("prompt"))
            longest = max(len(p) for p in prompts)
            # vLLM: completions default to 16 tokens; an explicit null means the context's room
            explicit_null = "max_tokens" in body and body["max_tokens"] is None
            budget = self._budget(body, longest, None if explicit_null else 16)
            logprobs = take_int(body, "logprobs", None, 0, MAX_LOGPROBS)
            opts = self._options(body, logprobs, take_int(body, "n", 1, 1, 16) or 1)
        except BadRequest as exc:
            return error_response(exc)
        samples = [sample(self._completion(p), budget) for p in prompts]
        served = self._served_by(body)
        if body.get("stream"):
            return self._stream(self._shift(served, completion_chunks(prompts, samples, opts)))
        await self._wait(max(len(s.token_ids) for s in samples))
        (answer,) = self._shift(served, [completion_response(prompts, samples, opts)])
        return json_response(answer)

    def _reply(self, messages: list[Any], tools: Any) -> Reply:
        reply = (self.script or chat_reply)(messages, tools)
        if self.thinking:
            return Reply(THOUGHT + reply.text, reply.tool_call)
        return reply

    def _completion(self, prompt: list[int]) -> Reply:
        """A token prompt that is a rendered chat asking for the assistant's turn is answered as
        that chat (token-in/token-out sends exactly such prompts); any other text is echoed."""
        text = decode(prompt, skip_special_tokens=False)
        chat = parse_chat(text)
        if chat is None:
            return Reply(completion_text(decode(prompt)))
        return self._reply(*chat)

    async def load_lora_adapter(self, request: Request) -> Response:
        """vLLM's runtime LoRA load: 400 for a name already loaded or a missing adapter."""
        try:
            body = await self._body(request)
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
                raise BadRequest("Both 'lora_name' and 'lora_path' must be provided.")
            if name in self.adapters:
                raise BadRequest(f"The lora adapter '{name}' has already been loaded.")
            if self.fail_loads:
                raise BadRequest(f"Failed to load LoRA adapter '{name}' (injected)", 500)
            if not os.path.isfile(os.path.join(path, ADAPTER_CONFIG)):
                raise BadRequest(f"No adapter found for {path}", 404)
        except BadRequest as exc:
            return error_response(exc)
        self.adapters[name] = path
        self.stats.events.append(("load", name))
        return Response(f"Success: LoRA adapter '{name}' added successfully.".encode(), 200)

    async def unload_lora_adapter(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            name = body.get("lora_name")
            if not isinstance(name, str) or name not in self.adapters:
                raise BadRequest(f"The lora adapter '{name}' cannot be found.", 404)
        except BadRequest as exc:
            return error_response(exc)
        del self.adapters[name]
        self.stats.events.append(("unload", name))
        return Response(f"Success: LoRA adapter '{name}' removed successfully.".encode(), 200)

    async def _wait(self, n_tokens: int) -> None:
        delay = self.ttft_s + self.token_delay_s * max(n_tokens - 1, 0)
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            while self.held:
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.stats.generations_cancelled += 1
            raise

    def _stream(self, chunks: Iterator[dict[str, Any]]) -> Response:
        return StreamingResponse(self._sse(chunks), media_type="text/event-stream")

    async def _sse(self, chunks: Iterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        """SSE events with the configured pacing: TTFT, then one token per `token_delay_s`."""
        finished = False
        tokens_sent = 0
        try:
            if self.ttft_s > 0:
                await asyncio.sleep(self.ttft_s)
            for chunk in chunks:
                choices = chunk["choices"]
                if choices and "role" not in choices[0].get("delta", ()):
                    if tokens_sent and self.token_delay_s > 0:
                        await asyncio.sleep(self.token_delay_s)
                    tokens_sent += 1
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if finished:
                self.stats.streams_finished += 1
            else:
                self.stats.streams_aborted += 1

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            if isinstance(body.get("messages"), list):
                add_prompt = body.get("add_generation_prompt", True) is not False
                rendered = render_chat(
                    body["messages"],
                    body.get("tools"),
                    add_prompt,
                    strip_thinking=self.thinking,
                    continue_final_message=bool(body.get("continue_final_message")),
                )
                ids = encode(rendered)
            elif isinstance(body.get("prompt"), str):
                ids = encode(body["prompt"])
            else:
                raise BadRequest("give `prompt` (a string) or `messages`")
        except BadRequest as exc:
            return error_response(exc)
        count = len(ids)
        return json_response(
            {"count": count, "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def detokenize(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            prompt = parse_prompts(body.get("tokens"))
        except BadRequest as exc:
            return error_response(exc)
        return json_response({"prompt": decode(prompt[0], skip_special_tokens=False)})

    async def models(self, request: Request) -> Response:
        self.stats.paths[request.url.path] += 1
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        loras = [
            {**card, "id": name, "root": path, "parent": self.model}
            for name, path in self.adapters.items()
        ]
        return json_response({"object": "list", "data": [card, *loras]})

    async def health(self, request: Request) -> Response:
        return Response(b"", 200)

    async def version(self, request: Request) -> Response:
        return json_response({"version": "0.32.0"})


def _shifted(value: Any, delta: float) -> Any:
    """`value` (a response or chunk) with every logprob moved by `delta`."""
    if isinstance(value, list):
        return [_shifted(v, delta) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "logprob" and isinstance(item, int | float):
            out[key] = item + delta
        elif key == "token_logprobs" and isinstance(item, list):
            out[key] = [v + delta if isinstance(v, int | float) else v for v in item]
        elif key == "top_logprobs" and isinstance(item, list):  # completions: {token: logprob}
            out[key] = [
                {k: v + delta for k, v in d.items()}
                if isinstance(d, dict) and "logprob" not in d
                else _shifted(d, delta)
                for d in item
            ]
        else:
            out[key] = _shifted(item, delta)
    return out


def create_fake_vllm_app(
    model: str = "fake-model",
    ttft_s: float = 0.0,
    token_delay_s: float = 0.0,
    max_model_len: int = 32768,
    script: Policy | None = None,
    thinking: bool = False,
) -> Starlette:
    """The fake engine as an ASGI app; `app.state.stats` is its `FakeStats`.

    `script`: answer chat with a scripted plan (scripted_policy) instead of the calculator.
    `thinking`: a reasoning model whose template strips earlier thinking (`FakeVllm.thinking`)."""
    fake = FakeVllm(model, ttft_s, token_delay_s, max_model_len, script, thinking)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", fake.chat, methods=["POST"]),
            Route("/v1/completions", fake.completions, methods=["POST"]),
            Route("/tokenize", fake.tokenize, methods=["POST"]),
            Route("/detokenize", fake.detokenize, methods=["POST"]),
            Route("/v1/models", fake.models, methods=["GET"]),
            Route("/v1/load_lora_adapter", fake.load_lora_adapter, methods=["POST"]),
            Route("/v1/unload_lora_adapter", fake.unload_lora_adapter, methods=["POST"]),
            Route("/health", fake.health, methods=["GET"]),
            Route("/version", fake.version, methods=["GET"]),
        ]
    )
    app.state.stats = fake.stats
    app.state.fake = fake
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the vLLM-shaped fake engine.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the 1st token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="delay between tokens")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--script", help="plan file or directory (testing/scripted_policy)")
    args = parser.parse_args(argv)

    import uvicorn

    app = create_fake_vllm_app(
        args.model,
        args.ttft_ms / 1000,
        args.token_delay_ms / 1000,
        args.max_model_len,
        load_policy(args.script) if args.script else None,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
