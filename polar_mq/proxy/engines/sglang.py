"""SGLang token capture: the exact ids through SGLang's `sglext` extension, logprobs as OpenAI's.

What SGLang's OpenAI-compatible server returns (read in sgl-project/sglang,
`python/sglang/srt/entrypoints/openai/serving_chat.py`, `serving_completions.py` and `protocol.py`,
main branch of 2026; the stored copies were found with the code search):

- Chat: `return_input_ids_in_sglext: true` and `return_output_ids_in_sglext: true` (also settable
  per server with `--return-input-ids/--return-output-ids`, or the `x-sglext-return-*-ids: 1`
  headers) add a response-level `sglext` object: `{"input_ids": [...], "output_ids": [[...] per
  choice]}`. Non-streaming it is a top-level field of the body; streaming it comes in one extra
  chunk with `choices: []` after the finish-reason chunk and before the usage chunk. These flags
  are the only id transport that works on streamed chat: `return_prompt_token_ids`,
  `return_token_ids` (choice `prompt_token_ids` / `response_token_ids`) and `return_meta_info`
  (choice `meta_info.output_token_logprobs` = `[(logprob, token_id, text), ...]`, the fields Polar
  reads) are refused with `stream: true`. Logprobs are OpenAI's `choices[i].logprobs.content[]`;
  a streamed chunk may carry several tokens' logprobs, and the finish reason comes in its own
  chunk with an empty delta (plus SGLang's `matched_stop`).
- Completions: `return_token_ids: true` gives `choices[i].token_ids` and
  `choices[i].prompt_token_ids` (streaming: the delta's ids in each chunk, the prompt ids in each
  choice's first chunk), like vLLM; logprobs are OpenAI's `token_logprobs`.

Older SGLang releases lack `sglext` ids; for those, route through the `generic` engine. The SGLang
router has dropped extension fields in some versions (REFERENCE.md): point the proxy at workers.
"""

from __future__ import annotations

from typing import Any

from polar_mq.proxy.engines import vllm
from polar_mq.proxy.engines.base import (
    CHAT,
    EXACT,
    Capture,
    LogprobTrail,
    View,
    chat_logprobs,
    choice0,
    exact_logprobs,
    int_list,
)

NAME = "sglang"
FIDELITY = EXACT
INPUT_IDS_FLAG = "return_input_ids_in_sglext"
OUTPUT_IDS_FLAG = "return_output_ids_in_sglext"
SGLEXT = "sglext"
_KEEP_INPUT_IDS = "sglext.input_ids"
_KEEP_OUTPUT_IDS = "sglext.output_ids"


def rewrite_request(
    api_type: str, body: dict[str, Any], served_model: str | None
) -> tuple[dict[str, Any], View]:
    """vLLM's rewrite (logprobs, model), with SGLang's id flags for chat (a shallow copy)."""
    upstream, view = vllm.rewrite_request(api_type, body, served_model)
    if api_type != CHAT:
        return upstream, view  # completions: `return_token_ids` works streamed or not
    if not view.token_ids:
        upstream.pop("return_token_ids", None)  # refused on streamed chat
    extras = set(view.extras)
    if body.get(INPUT_IDS_FLAG):
        extras.add(_KEEP_INPUT_IDS)
    if body.get(OUTPUT_IDS_FLAG):
        extras.add(_KEEP_OUTPUT_IDS)
    upstream[INPUT_IDS_FLAG] = True
    upstream[OUTPUT_IDS_FLAG] = True
    return upstream, View(
        api_type=view.api_type,
        agent_model=view.agent_model,
        token_ids=view.token_ids,
        logprobs=view.logprobs,
        prompt_logprobs=view.prompt_logprobs,
        kv_transfer=view.kv_transfer,
        extras=frozenset(extras),
    )


def visible(data: dict[str, Any], view: View) -> dict[str, Any]:
    """`data` as the agent should see it: a stripped shallow copy (the original is stored)."""
    out = dict(data)
    strip(out, view)
    return out


def strip(data: dict[str, Any], view: View, copy_choices: bool = True) -> None:
    """vLLM's strip (choice ids, logprobs, model name) plus the `sglext` ids we asked for."""
    ext = data.get(SGLEXT)
    if isinstance(ext, dict):
        kept = dict(ext)
        if _KEEP_INPUT_IDS not in view.extras:
            kept.pop("input_ids", None)
        if _KEEP_OUTPUT_IDS not in view.extras:
            kept.pop("output_ids", None)
        if kept:
            data[SGLEXT] = kept
        else:
            del data[SGLEXT]
    vllm.strip(data, view, copy_choices)


def _sglext_ids(data: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """(prompt ids, choice 0's output ids) from a body's or chunk's `sglext`, if present."""
    ext = data.get(SGLEXT)
    if not isinstance(ext, dict):
        return None, None
    outputs = ext.get("output_ids")
    first = outputs[0] if isinstance(outputs, list) and outputs else None
    return int_list(ext.get("input_ids")), int_list(first)


def extract_response(api_type: str, data: dict[str, Any]) -> Capture:
    """Token ids, logprobs and finish reason of a non-streaming response (choice 0)."""
    if api_type != CHAT:
        return vllm.extract_response(api_type, data)
    prompt_ids, completion_ids = _sglext_ids(data)
    choice = choice0(data)
    if choice is None:
        return Capture(prompt_ids=prompt_ids)
    if completion_ids is None:  # the agent's own `return_token_ids` (non-streaming only)
        completion_ids = int_list(choice.get("response_token_ids"))
        prompt_ids = prompt_ids or int_list(choice.get("prompt_token_ids"))
    values = chat_logprobs(choice.get("logprobs"))
    return Capture(
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        logprobs=None if completion_ids is None else exact_logprobs(values, len(completion_ids)),
        finish_reason=choice.get("finish_reason"),
    )


class StreamCapture:
    """vLLM's stream capture, with chat ids taken from SGLang's final `sglext` chunk.

    Text, tool calls, usage, errors and the finish reason are read exactly as for vLLM (the chunk
    shapes agree); completions streams carry per-chunk ids like vLLM's and are left to it.
    """

    __slots__ = ("_chat", "_ids_seen", "_inner", "_trail")

    def __init__(self, api_type: str) -> None:
        self._inner = vllm.StreamCapture(api_type)
        self._chat = api_type == CHAT
        self._trail = LogprobTrail(api_type)
        self._ids_seen = False

    @property
    def finish_reason(self) -> str | None:
        return self._inner.finish_reason

    @property
    def error(self) -> Any:
        return self._inner.error

    def feed(self, chunk: dict[str, Any]) -> bool:
        if not self._chat:
            return self._inner.feed(chunk)
        prompt_ids, completion_ids = _sglext_ids(chunk)
        if prompt_ids is not None:
            self._inner.prompt_ids = prompt_ids
        if completion_ids is not None:
            self._inner.completion_ids = completion_ids
            self._ids_seen = True
        choice = choice0(chunk)
        if choice is not None:
            self._trail.feed(choice)
        return self._inner.feed(chunk)

    def result(self) -> Capture:
        if not self._chat:
            return self._inner.result()
        ids = self._inner.completion_ids if self._ids_seen else None
        return Capture(
            prompt_ids=self._inner.prompt_ids,
            completion_ids=ids,
            logprobs=None if ids is None else self._trail.values(len(ids)),
            finish_reason=self._inner.finish_reason,
        )

    def summary(self) -> dict[str, Any]:
        return self._inner.summary()


def stream_capture(api_type: str) -> StreamCapture:
    return StreamCapture(api_type)
