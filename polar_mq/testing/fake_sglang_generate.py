"""SGLang's native `/generate` with `input_ids` on the SGLang-shaped fake (`fake_sglang`).

The fake's model answers a token prompt as `FakeVllm` answers a completions prompt (a rendered
chat asking for the assistant's turn is answered as that chat), in SGLang's native shape (see
`polar_mq.proxy.engines.sglang_generate` for where these facts were read):

- the body is `GenerateReqInput`: `input_ids` (or `text`), `sampling_params`, `stream`,
  `return_logprob`, `top_logprobs_num`, `return_text_in_logprobs`, `rid`, ...; an unknown field
  or sampling parameter is refused (400), as SGLang's dataclasses refuse them;
- `max_new_tokens` defaults to 128; the text skips special tokens (`<|im_end|>`), the ids keep
  the end-of-turn token the model sampled;
- the answer is `{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type": "stop",
  "matched": id} | {"type": "length", "length": n}, "prompt_tokens", "completion_tokens",
  "cached_tokens", "output_token_logprobs": [[logprob, id, text | null]], "output_top_logprobs",
  "weight_version"}}`;
- a stream is SSE `data:` events then `data: [DONE]`; each event holds the whole text, ids and
  logprobs so far (`finish_reason` null until the last), or only the new part when the server
  runs with `--incremental-streaming-output` (`incremental=True`).

Serve it with `python -m polar_mq.testing.fake_sglang_generate --port 8013 [--incremental]`.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar_mq.testing.fake_requests import BadRequest, error_response, json_response
from polar_mq.testing.fake_sampling import sample, token_logprob, top_candidates
from polar_mq.testing.fake_sglang import FakeSglang, create_fake_sglang_app
from polar_mq.testing.fake_tokenizer import IM_END, decode, encode

GENERATE_PATH = "/generate"
DEFAULT_MAX_NEW_TOKENS = 128
REQUEST_FIELDS = frozenset(
    (
        "text",
        "input_ids",
        "sampling_params",
        "stream",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
        "rid",
        "lora_path",
        "custom_logit_processor",
    )
)
SAMPLING_FIELDS = frozenset(
    (
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "logit_bias",
        "sampling_seed",
        "n",
        "json_schema",
        "regex",
        "ebnf",
    )
)


def _prompt(body: dict[str, Any]) -> list[int]:
    unknown = sorted(set(body) - REQUEST_FIELDS)
    if unknown:
        raise BadRequest(f"unexpected keyword argument(s) {unknown} for GenerateReqInput")
    ids = body.get("input_ids")
    if ids is None and isinstance(body.get("text"), str):
        return encode(body["text"])
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise BadRequest("Either text or input_ids should be provided.")
    return ids


def _params(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    unknown = sorted(set(params) - SAMPLING_FIELDS)
    if unknown:
        raise BadRequest(f"SamplingParams got unexpected keyword argument(s) {unknown}")
    limit = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not isinstance(limit, int) or limit < 0:
        raise BadRequest("max_new_tokens must be a non-negative integer")
    return params


def _logprobs(ids: list[int], start: int, top: int, text: bool) -> tuple[list[Any], list[Any]]:
    """SGLang's `[logprob, id, text]` entries (and the top ones) for `ids` from `start` on."""
    sampled, tops = [], []
    for position, token_id in enumerate(ids[start:], start):
        label = decode([token_id], skip_special_tokens=False) if text else None
        sampled.append([token_logprob(token_id, position), token_id, label])
        if top:
            tops.append(
                [
                    [value, alt, decode([alt], skip_special_tokens=False) if text else None]
                    for alt, value in top_candidates(token_id, position, top)
                ]
            )
    return sampled, tops


class FakeSglangGenerate:
    """The `/generate` handler on a `FakeSglang` (its model, pacing and stats)."""

    def __init__(self, fake: FakeSglang, incremental: bool = False) -> None:
        self.fake = fake
        self.incremental = incremental
        self.requests: list[dict[str, Any]] = []

    async def generate(self, request: Request) -> Response:
        fake = self.fake
        try:
            body = await fake._body(request)
            prompt = _prompt(body)
            params = _params(body)
            budget = min(
                params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
                fake.max_model_len - len(prompt),
            )
            if budget < 0:
                raise BadRequest("The input is longer than the model's context length.")
        except BadRequest as exc:
            return error_response(exc)
        self.requests.append(body)
        fake.stats.requests += 1
        fake.stats.last_request = body
        result = sample(fake._completion(prompt), budget)
        ids = list(result.token_ids)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        if body.get("stream"):
            events = self._events(rid, body, prompt, ids)
            return StreamingResponse(events, media_type="text/event-stream")
        await fake._wait(len(ids))
        return json_response(self._answer(rid, body, prompt, ids, len(ids), 0, final=True))

    def _answer(
        self,
        rid: str,
        body: dict[str, Any],
        prompt: list[int],
        ids: list[int],
        upto: int,
        since: int,
        final: bool,
    ) -> dict[str, Any]:
        """The answer (or event) for the first `upto` ids; `since`: ids sent before (a delta)."""
        out_ids = ids[since:upto]
        skip = (body.get("sampling_params") or {}).get("skip_special_tokens", True) is not False
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": None,
            "prompt_tokens": len(prompt),
            "completion_tokens": upto,
            "cached_tokens": 0,
            "weight_version": self.fake.weight_version,
        }
        if final:
            if upto and ids[upto - 1] == IM_END:
                meta["finish_reason"] = {"type": "stop", "matched": IM_END}
            else:
                meta["finish_reason"] = {"type": "length", "length": upto}
        if body.get("return_logprob"):
            top = int(body.get("top_logprobs_num") or 0)
            text = bool(body.get("return_text_in_logprobs"))
            sampled, tops = _logprobs(ids[:upto], since, top, text)
            meta["output_token_logprobs"] = sampled
            meta["output_top_logprobs"] = tops if top else [None] * len(sampled)
        return {"text": decode(out_ids, skip), "output_ids": out_ids, "meta_info": meta}

    async def _events(
        self, rid: str, body: dict[str, Any], prompt: list[int], ids: list[int]
    ) -> AsyncIterator[bytes]:
        fake = self.fake
        finished = False
        try:
            if fake.ttft_s > 0:
                await asyncio.sleep(fake.ttft_s)
            for upto in range(1, len(ids) + 1):
                if upto > 1 and fake.token_delay_s > 0:
                    await asyncio.sleep(fake.token_delay_s)
                since = upto - 1 if self.incremental else 0
                event = self._answer(rid, body, prompt, ids, upto, since, upto == len(ids))
                yield b"data: " + orjson.dumps(event) + b"\n\n"
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if finished:
                fake.stats.streams_finished += 1
            else:
                fake.stats.streams_aborted += 1


def create_fake_sglang_generate_app(
    model: str = "fake-model",
    ttft_s: float = 0.0,
    token_delay_s: float = 0.0,
    max_model_len: int = 32768,
    incremental: bool = False,
) -> Starlette:
    """`fake_sglang`'s app plus `/generate`; `app.state.generate` holds the requests it got."""
    app = create_fake_sglang_app(model, ttft_s, token_delay_s, max_model_len)
    handler = FakeSglangGenerate(app.state.fake, incremental)
    app.router.routes.append(Route(GENERATE_PATH, handler.generate, methods=["POST"]))
    app.state.generate = handler
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the SGLang fake with native /generate.")
    parser.add_argument("--port", type=int, default=8013)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--incremental", action="store_true")
    args = parser.parse_args(argv)
    import uvicorn

    app = create_fake_sglang_generate_app(args.model, incremental=args.incremental)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()


__all__ = ["FakeSglangGenerate", "create_fake_sglang_generate_app"]
