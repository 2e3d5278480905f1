"""Response bodies and stream chunks of the fake engine, field for field as vLLM 0.32 sends them.

Compare with `/work/shared/fixtures/vllm-0.32.0-cpu/` (recorded from the real server). Token ids are
only present when the request set `return_token_ids`, logprobs only when it asked for them; a field
not requested is left out (vLLM sends it as null or omits it; clients treat both alike).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from polar_mq.testing.fake_sampling import Sample, chat_logprob_entry, completion_logprobs
from polar_mq.testing.fake_tokenizer import StreamDecoder

FINGERPRINT = "vllm-0.32.0-fake"
_ids = itertools.count(1)


def next_id(prefix: str) -> str:
    """Request ids are sequential, not random: a fake stays deterministic and cheap."""
    return f"{prefix}{next(_ids):016x}"


@dataclass(frozen=True, slots=True)
class Options:
    """What a request asked for, after validation."""

    model: str
    want_ids: bool
    logprobs: int | None
    """chat: top_logprobs when `logprobs` is true, else None; completions: the `logprobs` int."""
    n: int
    include_usage: bool


def _usage(prompt: int, completion: int, details: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        usage["prompt_tokens_details"] = None
        usage["completion_tokens_details"] = None
    return usage


def _tool_calls(sample: Sample, call_id: str) -> list[dict[str, Any]]:
    assert sample.tool_call is not None
    function = {"name": sample.tool_call.name, "arguments": sample.tool_call.arguments}
    return [{"id": call_id, "type": "function", "function": function}]


def chat_response(prompt_ids: list[int], sample: Sample, opts: Options) -> dict[str, Any]:
    """A non-streaming `chat.completion` body."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if sample.tool_call else sample.text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if sample.tool_call:
        message["tool_calls"] = _tool_calls(sample, next_id("chatcmpl-tool-"))
    message["reasoning"] = None
    choices = []
    for index in range(opts.n):
        choice: dict[str, Any] = {"index": index, "message": message, "logprobs": None}
        if opts.logprobs is not None:
            content = [
                chat_logprob_entry(t, i, opts.logprobs) for i, t in enumerate(sample.token_ids)
            ]
            choice["logprobs"] = {"content": content}
        choice["finish_reason"] = sample.finish_reason
        choice["stop_reason"] = None
        if opts.want_ids:
            choice["token_ids"] = sample.token_ids
        choice["routed_experts"] = None
        choices.append(choice)
    body: dict[str, Any] = {
        "id": next_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": opts.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": _usage(len(prompt_ids), len(sample.token_ids) * opts.n, details=True),
        "prompt_logprobs": None,
    }
    if opts.want_ids:
        body["prompt_token_ids"] = prompt_ids
        body["prompt_text"] = None
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return body


def chat_chunks(prompt_ids: list[int], sample: Sample, opts: Options) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` events of a streamed answer, one generated token per chunk."""
    head = {
        "id": next_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": opts.model,
    }
    for index in range(opts.n):
        role: dict[str, Any] = {"role": "assistant", "content": ""}
        first = {**head, "choices": [_chat_choice(index, role, None, None)]}
        if opts.want_ids and index == 0:
            first.update(prompt_token_ids=prompt_ids, prompt_text=None)
        yield first
    decoders = [StreamDecoder() for _ in range(opts.n)]
    call_id = next_id("chatcmpl-tool-")
    last = len(sample.token_ids) - 1
    for position, token_id in enumerate(sample.token_ids):
        for index in range(opts.n):
            text = decoders[index].step(token_id)
            delta: dict[str, Any]
            if sample.tool_call is None:
                delta = {"content": text}
            elif position == 0:
                delta = {"tool_calls": [{"index": 0, **_tool_calls(sample, call_id)[0]}]}
            else:
                delta = {}
            logprobs = None
            if opts.logprobs is not None:
                logprobs = {"content": [chat_logprob_entry(token_id, position, opts.logprobs)]}
            finish = sample.finish_reason if position == last else None
            choice = _chat_choice(index, delta, logprobs, finish)
            if finish:
                choice["stop_reason"] = None
            if opts.want_ids:
                choice["token_ids"] = [token_id]
            yield {**head, "choices": [choice]}
    if opts.include_usage:
        usage = _usage(len(prompt_ids), len(sample.token_ids) * opts.n, details=False)
        yield {**head, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT}


def _chat_choice(index: int, delta: dict[str, Any], logprobs: Any, finish: str | None) -> Any:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def completion_response(
    prompts: list[list[int]], samples: list[Sample], opts: Options
) -> dict[str, Any]:
    """A non-streaming `text_completion` body (one choice per prompt and sample)."""
    choices = []
    for index, (prompt_ids, sample) in enumerate(_per_choice(prompts, samples, opts.n)):
        choice: dict[str, Any] = {"index": index, "text": sample.text, "logprobs": None}
        if opts.logprobs is not None:
            choice["logprobs"] = completion_logprobs(sample.token_ids, 0, opts.logprobs, 0)
        choice.update(finish_reason=sample.finish_reason, stop_reason=None)
        if opts.want_ids:
            choice["token_ids"] = sample.token_ids
        choice["prompt_logprobs"] = None
        if opts.want_ids:
            choice["prompt_token_ids"] = prompt_ids
        choice["routed_experts"] = None
        choices.append(choice)
    n_prompt = sum(len(p) for p in prompts)
    n_completion = sum(len(s.token_ids) for s in samples) * opts.n
    return {
        "id": next_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": opts.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": _usage(n_prompt, n_completion, details=True),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunks(
    prompts: list[list[int]], samples: list[Sample], opts: Options
) -> Iterator[dict[str, Any]]:
    """Streamed `text_completion` events; the first chunk of each choice carries its prompt ids."""
    head = {
        "id": next_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": opts.model,
    }
    for index, (prompt_ids, sample) in enumerate(_per_choice(prompts, samples, opts.n)):
        full = None
        if opts.logprobs is not None:
            full = completion_logprobs(sample.token_ids, 0, opts.logprobs, 0)
        decoder = StreamDecoder()
        last = len(sample.token_ids) - 1
        for position, token_id in enumerate(sample.token_ids):
            logprobs = None if full is None else {k: [v[position]] for k, v in full.items()}
            choice: dict[str, Any] = {
                "index": index,
                "text": decoder.step(token_id),
                "logprobs": logprobs,
                "finish_reason": sample.finish_reason if position == last else None,
                "stop_reason": None,
            }
            if opts.want_ids:
                choice["prompt_token_ids"] = prompt_ids if position == 0 else None
                choice["token_ids"] = [token_id]
            yield {**head, "choices": [choice]}
    if opts.include_usage:
        n_prompt = sum(len(p) for p in prompts)
        n_completion = sum(len(s.token_ids) for s in samples) * opts.n
        usage = _usage(n_prompt, n_completion, details=False)
        yield {**head, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT}


def _per_choice(
    prompts: list[list[int]], samples: list[Sample], n: int
) -> Iterator[tuple[list[int], Sample]]:
    for prompt_ids, sample in zip(prompts, samples, strict=True):
        for _ in range(n):
            yield prompt_ids, sample
