"""Any OpenAI-compatible server: forward untouched, get the ids afterwards from its `/tokenize`.

A server we know nothing about may reject unknown request fields, so nothing is added to the
agent's request (logprobs are captured only when the agent asked for them) and only the model name
is rewritten. The token ids are then obtained after the call by `engines.retokenize`: the prompt
through the backend's vLLM/SGLang-style `/tokenize` (`messages` with the chat template, or the
completions prompt; a token-id prompt is taken as is) and the completion by tokenizing its text.

That is lower fidelity than `vllm`/`sglang` and the stored calls say so (`response.fidelity` =
"retokenized"): text does not always round-trip to the sampled ids (tokenization is not unique,
the end-of-turn token a model stopped on is not in the text, tool calls are re-rendered by the
template), so logprobs are kept only when their count matches the re-tokenized completion.
"""

from __future__ import annotations

from typing import Any

from polar_mq.proxy.engines import vllm
from polar_mq.proxy.engines.base import (
    CHAT,
    RETOKENIZED,
    Capture,
    LogprobTrail,
    View,
    chat_logprobs,
    choice0,
    completion_logprobs,
    exact_logprobs,
)

NAME = "generic"
FIDELITY = RETOKENIZED


def rewrite_request(
    api_type: str, body: dict[str, Any], served_model: str | None
) -> tuple[dict[str, Any], View]:
    """Only the model name changes; the agent sees everything the server sends back."""
    upstream = dict(body)
    if served_model is not None:
        upstream["model"] = served_model
    view = View(api_type, body.get("model"), True, True, True, True)
    return upstream, view


def visible(data: dict[str, Any], view: View) -> dict[str, Any]:
    return vllm.visible(data, view)


def strip(data: dict[str, Any], view: View, copy_choices: bool = True) -> None:
    vllm.strip(data, view, copy_choices)


def extract_response(api_type: str, data: dict[str, Any]) -> Capture:
    """Finish reason and the agent's own logprobs; the ids are filled in by re-tokenizing."""
    choice = choice0(data)
    if choice is None:
        return Capture()
    raw = choice.get("logprobs")
    values = chat_logprobs(raw) if api_type == CHAT else completion_logprobs(raw)
    return Capture(
        logprobs=None if values is None else exact_logprobs(values, len(values)),
        finish_reason=choice.get("finish_reason"),
    )


class StreamCapture:
    """vLLM's stream capture for text, tool calls and finish reason, plus the agent's logprobs."""

    __slots__ = ("_inner", "_trail")

    def __init__(self, api_type: str) -> None:
        self._inner = vllm.StreamCapture(api_type)
        self._trail = LogprobTrail(api_type)

    @property
    def finish_reason(self) -> str | None:
        return self._inner.finish_reason

    @property
    def error(self) -> Any:
        return self._inner.error

    def feed(self, chunk: dict[str, Any]) -> bool:
        choice = choice0(chunk)
        if choice is not None:
            self._trail.feed(choice)
        return self._inner.feed(chunk)

    def result(self) -> Capture:
        return Capture(logprobs=self._trail.values(None), finish_reason=self._inner.finish_reason)

    def summary(self) -> dict[str, Any]:
        return self._inner.summary()


def stream_capture(api_type: str) -> StreamCapture:
    return StreamCapture(api_type)
