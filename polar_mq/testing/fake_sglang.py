"""An SGLang-shaped fake engine: the fake vLLM's model and tokenizer, SGLang's wire format.

It runs `FakeVllm` (same scripted policy, byte tokenizer, logprobs and pacing: the same request
gets the same tokens from both fakes) and re-shapes each answer the way SGLang's OpenAI server
does (see `polar_mq.proxy.engines.sglang` for the source of these facts):

- chat ids only through `sglext` (`return_input_ids_in_sglext` / `return_output_ids_in_sglext`):
  a top-level `sglext` in the body, or one `choices: []` chunk at the end of a stream;
  `return_token_ids` / `return_prompt_token_ids` / `return_meta_info` are refused when streaming
  and give choice `prompt_token_ids` / `response_token_ids` / `meta_info` otherwise;
- a streamed chat's finish reason in its own chunk (empty delta, `matched_stop`);
- completions ids per choice with `return_token_ids`, as vLLM;
- SGLang's field set: `matched_stop`, `reasoning_content`, `metadata`; none of vLLM's extras
  (`stop_reason`, `service_tier`, `prompt_text`, `kv_transfer_params`, ...);
- `POST /update_weights_from_disk {"model_path", "weight_version"?}` reloads the weights in
  place as SGLang's does: 200 `{"success": true, "message", "num_paused_requests"}`, or 400 with
  `"success": false` for a path that holds no model (`config.json`) or an injected failure
  (`fail_loads`). Each load moves every logprob of the base model's answers by another
  `CHECKPOINT_SHIFT`, so a call tells which weights served it, and `metadata.weight_version`
  (SGLang's, in every answer) becomes the given version.

Serve it with `python -m polar_mq.testing.fake_sglang --port 8012`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar_mq.testing.fake_requests import BadRequest, json_response
from polar_mq.testing.fake_tokenizer import IM_END
from polar_mq.testing.fake_vllm import FakeVllm, _shifted

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
METADATA = {"weight_version": "default"}
CHECKPOINT_SHIFT = -0.25
"""Added to every logprob of the base model's answers by each checkpoint loaded from disk."""
MODEL_CONFIG = "config.json"
_VLLM_ONLY = (
    "service_tier",
    "system_fingerprint",
    "prompt_logprobs",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
)
_VLLM_ONLY_CHOICE = ("stop_reason", "routed_experts", "prompt_logprobs")
_REFUSED_WHEN_STREAMING = ("return_prompt_token_ids", "return_token_ids", "return_meta_info")


@dataclass(frozen=True, slots=True)
class Asked:
    """The SGLang-specific fields of one request."""

    chat: bool
    stream: bool
    input_ids: bool
    output_ids: bool
    token_ids: bool
    prompt_token_ids: bool
    meta_info: bool

    @classmethod
    def of(cls, path: str, body: dict[str, Any]) -> Asked:
        chat = path == CHAT_PATH
        stream = bool(body.get("stream"))
        if chat and stream:
            for key in _REFUSED_WHEN_STREAMING:
                if body.get(key):
                    raise BadRequest(
                        f"{key} is not supported with streaming. "
                        f"Please set stream=false when using {key}=true."
                    )
        return cls(
            chat=chat,
            stream=stream,
            input_ids=bool(body.get("return_input_ids_in_sglext")),
            output_ids=bool(body.get("return_output_ids_in_sglext")),
            token_ids=bool(body.get("return_token_ids")),
            prompt_token_ids=bool(body.get("return_prompt_token_ids")),
            meta_info=bool(body.get("return_meta_info")),
        )

    def sglext(self, prompt_ids: list[int] | None, outputs: list[list[int]]) -> dict[str, Any]:
        ext: dict[str, Any] = {}
        if self.input_ids and prompt_ids is not None:
            ext["input_ids"] = prompt_ids
        if self.output_ids:
            ext["output_ids"] = outputs
        return ext


class FakeSglang(FakeVllm):
    """`FakeVllm` asked for everything, its answers re-shaped (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_path: str | None = None
        """The checkpoint last loaded from disk (None: the weights it started with)."""
        self.weight_version = METADATA["weight_version"]
        self.checkpoint_loads = 0

    async def update_weights_from_disk(self, request: Request) -> Response:
        """SGLang's in-place reload: its answer shape, 400 when the path holds no model."""
        try:
            body = await super()._body(request)
        except BadRequest as exc:
            return _weights_answer(False, str(exc), 400)
        path, version = body.get("model_path"), body.get("weight_version")
        if not isinstance(path, str) or not path:
            return _weights_answer(False, "model_path is required", 400)
        if self.fail_loads:
            return _weights_answer(False, f"Failed to update weights: {path} (injected)", 400)
        if not os.path.isfile(os.path.join(path, MODEL_CONFIG)):
            message = f"Failed to get weights iterator: {path} is not a model directory"
            return _weights_answer(False, message, 400)
        self.model_path = path
        self.checkpoint_loads += 1
        if isinstance(version, str):
            self.weight_version = version
        self.stats.events.append(("update_weights", path))
        return _weights_answer(True, "Succeeded to update model weights.", 200)

    def _shift(self, served: str, chunks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The adapters' mark (the vLLM fake's), then the checkpoints' on the base model."""
        delta = CHECKPOINT_SHIFT * self.checkpoint_loads if served == self.model else 0.0
        for chunk in super()._shift(served, chunks):
            yield _shifted(chunk, delta) if delta else chunk

    async def _body(self, request: Request) -> dict[str, Any]:
        body = await super()._body(request)
        path = request.url.path
        if path not in (CHAT_PATH, COMPLETIONS_PATH):
            return body
        request.state.asked = Asked.of(path, body)
        request.state.original = body
        inner = {k: v for k, v in body.items() if not k.startswith("return_")}
        inner["return_token_ids"] = True  # the ids we move to where SGLang puts them
        return inner

    async def chat(self, request: Request) -> Response:
        return self._reshape(request, await super().chat(request))

    async def completions(self, request: Request) -> Response:
        return self._reshape(request, await super().completions(request))

    def _reshape(self, request: Request, response: Response) -> Response:
        asked: Asked | None = getattr(request.state, "asked", None)
        if asked is None or response.status_code != 200:
            return response
        self.stats.last_request = request.state.original
        if isinstance(response, StreamingResponse):
            chunks = _stream(response.body_iterator, asked)
            return StreamingResponse(chunks, media_type="text/event-stream")
        data = orjson.loads(bytes(response.body))
        out = _chat_body(data, asked) if asked.chat else _completion_body(data, asked)
        out["metadata"] = {"weight_version": self.weight_version}
        return json_response(out)


def _weights_answer(success: bool, message: str, status: int) -> Response:
    return json_response({"success": success, "message": message, "num_paused_requests": 0}, status)


def _matched_stop(choice: dict[str, Any]) -> int | None:
    return IM_END if choice.get("finish_reason") in ("stop", "tool_calls") else None


def _common(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in _VLLM_ONLY}


def _chat_body(data: dict[str, Any], asked: Asked) -> dict[str, Any]:
    out = _common(data)
    prompt_ids = out.pop("prompt_token_ids", None)
    out.pop("prompt_text", None)
    choices, outputs = [], []
    for choice in data["choices"]:
        ids = choice.get("token_ids") or []
        outputs.append(ids)
        message = choice["message"]
        new: dict[str, Any] = {
            "index": choice["index"],
            "message": {
                "role": "assistant",
                "content": message.get("content") or "",
                "reasoning_content": None,
                "tool_calls": message.get("tool_calls"),
            },
            "logprobs": choice["logprobs"],
            "finish_reason": choice["finish_reason"],
            "matched_stop": _matched_stop(choice),
        }
        if asked.token_ids or asked.prompt_token_ids:
            new["prompt_token_ids"] = prompt_ids
        if asked.token_ids:
            new["response_token_ids"] = ids
        if asked.meta_info:
            entries = (choice["logprobs"] or {}).get("content") or [{}] * len(ids)
            triples = [
                [e.get("logprob"), t, e.get("token")] for e, t in zip(entries, ids, strict=False)
            ]
            new["meta_info"] = {"output_token_logprobs": triples, "completion_tokens": len(ids)}
        choices.append(new)
    out["choices"] = choices
    out["metadata"] = METADATA
    ext = asked.sglext(prompt_ids, outputs)
    if ext:
        out["sglext"] = ext
    return out


def _completion_choice(choice: dict[str, Any], asked: Asked) -> dict[str, Any]:
    new = {k: v for k, v in choice.items() if k not in _VLLM_ONLY_CHOICE}
    if not asked.token_ids:
        new.pop("token_ids", None)
        new.pop("prompt_token_ids", None)
    elif new.get("prompt_token_ids") is None:
        new.pop("prompt_token_ids", None)  # SGLang sends the prompt ids in the first chunk only
    new["matched_stop"] = _matched_stop(choice)
    return new


def _completion_body(data: dict[str, Any], asked: Asked) -> dict[str, Any]:
    out = _common(data)
    out["choices"] = [_completion_choice(c, asked) for c in data["choices"]]
    out["metadata"] = METADATA
    return out


async def _stream(events: AsyncIterable[Any], asked: Asked) -> AsyncIterator[bytes]:
    """The vLLM fake's events (one per read) re-shaped; the pacing is the inner stream's."""
    prompt_ids: list[int] | None = None
    outputs: dict[int, list[int]] = {}
    ext_sent = False
    iterator = aiter(events)
    try:
        async for raw in iterator:
            payload = bytes(raw)[len(b"data: ") :].strip()
            if payload == b"[DONE]" or not payload.startswith(b"{"):
                if asked.chat and not ext_sent:
                    ext_sent = True
                    yield _sglext_event(asked, prompt_ids, outputs)
                yield bytes(raw)
                continue
            chunk = _common(orjson.loads(payload))
            if not asked.chat:
                chunk["choices"] = [_completion_choice(c, asked) for c in chunk["choices"]]
                yield _event(chunk)
                continue
            prompt_ids = chunk.pop("prompt_token_ids", None) or prompt_ids
            chunk.pop("prompt_text", None)
            if not chunk["choices"] and not ext_sent:  # the usage chunk comes after sglext
                ext_sent = True
                yield _sglext_event(asked, prompt_ids, outputs)
            for event in _chat_chunk_events(chunk, outputs):
                yield event
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()  # the inner fake counts finished vs aborted streams


def _chat_chunk_events(chunk: dict[str, Any], outputs: dict[int, list[int]]) -> list[bytes]:
    """One vLLM chunk as SGLang sends it: ids moved out, the finish reason in its own chunk."""
    finished = []
    for choice in chunk["choices"]:
        outputs.setdefault(choice["index"], []).extend(choice.pop("token_ids", None) or [])
        for key in _VLLM_ONLY_CHOICE:
            choice.pop(key, None)
        if choice.get("finish_reason") is not None:
            finished.append(
                {
                    "index": choice["index"],
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                    "matched_stop": _matched_stop(choice),
                }
            )
            choice["finish_reason"] = None
    events = [_event(chunk)]
    events += [_event({**chunk, "choices": [c]}) for c in finished]
    return events


def _sglext_event(
    asked: Asked, prompt_ids: list[int] | None, outputs: dict[int, list[int]]
) -> bytes:
    ext = asked.sglext(prompt_ids, [outputs[i] for i in sorted(outputs)])
    if not ext:
        return b""
    return _event({"object": "chat.completion.chunk", "choices": [], "sglext": ext})


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def create_fake_sglang_app(
    model: str = "fake-model",
    ttft_s: float = 0.0,
    token_delay_s: float = 0.0,
    max_model_len: int = 32768,
) -> Starlette:
    """The SGLang-shaped fake as an ASGI app; `app.state.stats` is its `FakeStats`."""
    fake = FakeSglang(model, ttft_s, token_delay_s, max_model_len)
    app = Starlette(
        routes=[
            Route(CHAT_PATH, fake.chat, methods=["POST"]),
            Route(COMPLETIONS_PATH, fake.completions, methods=["POST"]),
            Route("/tokenize", fake.tokenize, methods=["POST"]),
            Route("/detokenize", fake.detokenize, methods=["POST"]),
            Route("/v1/models", fake.models, methods=["GET"]),
            Route("/health", fake.health, methods=["GET"]),
            Route("/update_weights_from_disk", fake.update_weights_from_disk, methods=["POST"]),
        ]
    )
    app.state.stats = fake.stats
    app.state.fake = fake
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the SGLang-shaped fake engine.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the 1st token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="delay between tokens")
    args = parser.parse_args(argv)

    import uvicorn

    app = create_fake_sglang_app(args.model, args.ttft_ms / 1000, args.token_delay_ms / 1000)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
