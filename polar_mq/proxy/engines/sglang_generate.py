"""SGLang's native `/generate` with `input_ids`: how a token prompt (TITO) reaches SGLang.

SGLang's OpenAI server takes text or chat messages; its native `/generate` takes the token ids
themselves (`input_ids`), as the RL trainers built on SGLang call it. Read in sgl-project/sglang
(`python/sglang/srt/managers/io_struct.py` `GenerateReqInput`, `tokenizer_manager.py`,
`docs/.../sampling_params.md`, main branch of 2026; found with the code search):

- Request: `input_ids`, `sampling_params` (`max_new_tokens`, `temperature`, `top_p`, `top_k`,
  `min_p`, `stop`, `stop_token_ids`, `presence_penalty`, `frequency_penalty`,
  `repetition_penalty`, `min_new_tokens`, `ignore_eos`, `skip_special_tokens`,
  `spaces_between_special_tokens`, `no_stop_trim`, `logit_bias`, `sampling_seed`), `stream`,
  `return_logprob`, `top_logprobs_num`, `return_text_in_logprobs`.
- Answer: `text`, `output_ids`, `meta_info` with `id`, `finish_reason` (`{"type": "stop",
  "matched": ...}`, `{"type": "length", "length": n}`, `{"type": "abort", ...}`, null while a
  stream runs), `prompt_tokens`, `completion_tokens`, `output_token_logprobs` (`[logprob,
  token_id, text]` per generated token) and `output_top_logprobs`. The prompt ids are not sent
  back: they are the ids the proxy sent.
- Streaming: SSE `data: {...}` events, then `data: [DONE]`. By default each event carries the
  whole text and ids so far; with `--incremental-streaming-output` only the new part (logprobs
  sliced alike). `meta_info.completion_tokens` counts every id so far in both modes, which tells
  them apart: an event whose `output_ids` are fewer than that count is a delta.

`GenerateAnswer` rewrites each answer (in place) into vLLM's completions shape, `token_ids` and
`prompt_token_ids` included, so the capture code, the stored row and the TITO answerer read an
SGLang token-in call exactly like a vLLM one. A request without `max_tokens` gets SGLang's own
default (`max_new_tokens` 128), not the context's room as on the chat path.
"""

from __future__ import annotations

import time
from typing import Any

GENERATE_PATH = "/generate"
SAMPLING = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "include_stop_str_in_output": "no_stop_trim",
    "logit_bias": "logit_bias",
    "seed": "sampling_seed",
}
"""Completions field -> SGLang `sampling_params` field."""


def generate_body(completion: dict[str, Any]) -> dict[str, Any]:
    """The `/generate` body for a completions body whose `prompt` is a list of ids."""
    params = {
        native: completion[name]
        for name, native in SAMPLING.items()
        if completion.get(name) is not None
    }
    body: dict[str, Any] = {
        "input_ids": completion["prompt"],
        "sampling_params": params,
        "stream": bool(completion.get("stream")),
        "return_logprob": True,  # the sampled ids' logprobs, as the chat path stores them
        "return_text_in_logprobs": True,
    }
    top = completion.get("logprobs")
    if isinstance(top, int) and top > 0:
        body["top_logprobs_num"] = top
    if completion.get("request_id") is not None:
        body["rid"] = completion["request_id"]
    return body


def finish_of(reason: Any) -> tuple[str | None, Any]:
    """(completions finish reason, stop reason) from `meta_info.finish_reason`."""
    if not isinstance(reason, dict):
        return None, None
    kind = reason.get("type")
    return (str(kind) if kind is not None else None), reason.get("matched")


def _logprob_text(entry: Any) -> str:
    text = entry[2] if isinstance(entry, list | tuple) and len(entry) > 2 else None
    return text if isinstance(text, str) else ""


def completion_logprobs(sampled: list[Any], tops: list[Any] | None) -> dict[str, Any]:
    """SGLang's `[logprob, id, text]` entries as completions logprobs."""
    top_out: list[Any] = []
    for row in tops or [None] * len(sampled):
        if not isinstance(row, list):
            top_out.append(None)
            continue
        top_out.append({_logprob_text(e): e[0] for e in row if isinstance(e, list | tuple)})
    return {
        "tokens": [_logprob_text(e) for e in sampled],
        "token_logprobs": [e[0] if isinstance(e, list | tuple) else None for e in sampled],
        "top_logprobs": top_out,
        "text_offset": [],
    }


class GenerateAnswer:
    """One call's conversion of SGLang's answer (or stream events) into completions' shape."""

    def __init__(self, prompt: list[int], model: Any, include_usage: bool = False) -> None:
        self.prompt = prompt
        self.model = model
        self.include_usage = include_usage
        self._text = ""
        self._ids: list[int] = []
        self._started = False
        self._created = int(time.time())

    def _usage(self, meta: dict[str, Any], n_ids: int) -> dict[str, int]:
        prompt = meta.get("prompt_tokens")
        prompt = prompt if isinstance(prompt, int) else len(self.prompt)
        return {"prompt_tokens": prompt, "completion_tokens": n_ids, "total_tokens": prompt + n_ids}

    def _head(self, meta: dict[str, Any], obj: str) -> dict[str, Any]:
        return {
            "id": "cmpl-" + str(meta.get("id") or ""),
            "object": obj,
            "created": self._created,
            "model": self.model,
        }

    def answer(self, data: dict[str, Any]) -> None:
        """A non-streamed answer, rewritten in place."""
        if "choices" in data or "error" in data:
            return
        meta = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
        assert isinstance(meta, dict)
        sampled = meta.get("output_token_logprobs")
        sampled = sampled if isinstance(sampled, list) else []
        ids = data.get("output_ids")
        if not isinstance(ids, list):
            ids = [e[1] for e in sampled if isinstance(e, list | tuple) and len(e) > 1]
        finish, stop = finish_of(meta.get("finish_reason"))
        choice = {
            "index": 0,
            "text": data.get("text") or "",
            "logprobs": completion_logprobs(sampled, meta.get("output_top_logprobs")),
            "finish_reason": finish,
            "stop_reason": stop,
            "token_ids": ids,
            "prompt_token_ids": self.prompt,
        }
        head = self._head(meta, "text_completion")
        data.clear()
        data.update(head, choices=[choice], usage=self._usage(meta, len(ids)))

    def chunk(self, data: dict[str, Any]) -> None:
        """One stream event, rewritten in place into a completions chunk (only the new part)."""
        if "choices" in data or "error" in data:
            return
        meta = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
        assert isinstance(meta, dict)
        ids = data.get("output_ids")
        ids = ids if isinstance(ids, list) else []
        count = meta.get("completion_tokens")
        cumulative = not isinstance(count, int) or len(ids) >= count
        text = data.get("text")
        if not isinstance(text, str):  # an event without its text: none new in it
            text = self._text if cumulative else ""
        sampled = meta.get("output_token_logprobs")
        sampled = sampled if isinstance(sampled, list) else []
        tops = meta.get("output_top_logprobs")
        if cumulative:
            seen = len(self._ids)
            new_ids, new_text = ids[seen:], text[len(self._text) :]
            self._ids, self._text = list(ids), text
            if len(sampled) > len(new_ids):  # every logprob so far: keep the new ones
                sampled = sampled[len(sampled) - len(new_ids) :]
                if isinstance(tops, list):
                    tops = tops[len(tops) - len(new_ids) :]
        else:
            new_ids, new_text = ids, text
            self._ids.extend(ids)
            self._text += text
        finish, stop = finish_of(meta.get("finish_reason"))
        choice: dict[str, Any] = {
            "index": 0,
            "text": new_text,
            "logprobs": completion_logprobs(sampled, tops if isinstance(tops, list) else None),
            "finish_reason": finish,
            "stop_reason": stop,
            "token_ids": new_ids,
        }
        if not self._started:
            self._started = True
            choice["prompt_token_ids"] = self.prompt
        head = self._head(meta, "text_completion")
        data.clear()
        data.update(head, choices=[choice])
        if finish is not None and self.include_usage:
            data["usage"] = self._usage(meta, len(self._ids))
