"""vLLM token capture: ask for ids and logprobs, read them back, hide what the agent didn't ask.

vLLM (0.10+) returns the exact token ids when asked with `return_token_ids: true` (chat: top-level
`prompt_token_ids` and `choices[i].token_ids`; completions: both per choice; streaming: the prompt
ids in the first chunk, the ids of each delta in later chunks) and per-token logprobs with
`logprobs`. We never re-tokenize text: the ids here are the ones the engine sampled.

Only choice 0 is captured: agents sample one choice per call (`n` > 1 and batched completion
prompts are forwarded, and their full response is stored, but the token columns hold choice 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar_mq.proxy.engines.base import (
    CHAT,
    COMPLETIONS,
    EXACT,
    Capture,
    View,
    aligned,
    chat_logprobs,
    choice0,
    completion_logprobs,
)

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "FIDELITY",
    "NAME",
    "Capture",
    "StreamCapture",
    "View",
    "extract_response",
    "rewrite_request",
    "stream_capture",
    "strip",
    "visible",
]

NAME = "vllm"
FIDELITY = EXACT


def rewrite_request(
    api_type: str, body: dict[str, Any], served_model: str | None
) -> tuple[dict[str, Any], View]:
    """The body to send upstream (a shallow copy; the agent's body stays intact for the log)."""
    asked_logprobs = body.get("logprobs")
    if api_type == CHAT:
        wants_logprobs = bool(asked_logprobs)
    else:
        wants_logprobs = asked_logprobs is not None and asked_logprobs is not False
    view = View(
        api_type=api_type,
        agent_model=body.get("model"),
        token_ids=bool(body.get("return_token_ids")),
        logprobs=wants_logprobs,
        prompt_logprobs=body.get("prompt_logprobs") is not None,
        kv_transfer="kv_transfer_params" in body,
    )
    upstream = dict(body)
    upstream["return_token_ids"] = True
    if api_type == CHAT:
        upstream["logprobs"] = True
    elif asked_logprobs is None or asked_logprobs is False:
        upstream["logprobs"] = 0
    elif isinstance(asked_logprobs, int):
        upstream["logprobs"] = max(asked_logprobs, 0)
    if served_model is not None:
        upstream["model"] = served_model
    return upstream, view


def visible(data: dict[str, Any], view: View) -> dict[str, Any]:
    """`data` as the agent should see it: a stripped shallow copy (the original is stored)."""
    out = dict(data)
    strip(out, view)
    return out


def strip(data: dict[str, Any], view: View, copy_choices: bool = True) -> None:
    """Remove in place what the agent did not ask for and restore its model name.

    Only the top level and the choice dicts are modified; with `copy_choices` a choice is replaced
    by a shallow copy before it is changed, so objects shared with the stored response stay intact
    (stream chunks are not stored and skip the copy).
    """
    if not view.token_ids:
        data.pop("prompt_token_ids", None)
        data.pop("prompt_text", None)
    if not view.prompt_logprobs:
        data.pop("prompt_logprobs", None)
    if not view.kv_transfer:
        data.pop("kv_transfer_params", None)
    if view.agent_model is not None and "model" in data:
        data["model"] = view.agent_model
    choices = data.get("choices")
    if not choices or (view.token_ids and view.logprobs and view.prompt_logprobs):
        return
    stripped = []
    for choice in choices:
        if isinstance(choice, dict):
            if copy_choices:
                choice = dict(choice)
            if not view.token_ids:
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            if not view.prompt_logprobs:
                choice.pop("prompt_logprobs", None)
            if not view.logprobs and "logprobs" in choice:
                choice["logprobs"] = None
        stripped.append(choice)
    data["choices"] = stripped


def extract_response(api_type: str, data: dict[str, Any]) -> Capture:
    """Token ids, logprobs and finish reason of a non-streaming response (choice 0)."""
    choice = choice0(data)
    if choice is None:
        return Capture(prompt_ids=data.get("prompt_token_ids"))
    completion_ids = choice.get("token_ids")
    if api_type == CHAT:
        prompt_ids = data.get("prompt_token_ids")
        values = chat_logprobs(choice.get("logprobs"))
    else:
        prompt_ids = choice.get("prompt_token_ids")
        values = completion_logprobs(choice.get("logprobs"))
    n_ids = len(completion_ids) if isinstance(completion_ids, list) else 0
    return Capture(
        prompt_ids=prompt_ids if isinstance(prompt_ids, list) else None,
        completion_ids=completion_ids if isinstance(completion_ids, list) else None,
        logprobs=aligned(values, n_ids) if completion_ids is not None else None,
        finish_reason=choice.get("finish_reason"),
    )


@dataclass(slots=True)
class StreamCapture:
    """Accumulates choice 0 of a stream, chunk by chunk, plus the summary we store as response."""

    api_type: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    logprobs_missing: bool = False
    finish_reason: str | None = None
    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    error: Any = None
    saw_tokens: bool = False

    def feed(self, chunk: dict[str, Any]) -> bool:
        """Take one parsed chunk; True when it is the first one that carries generated tokens."""
        first = False
        if self.api_type == CHAT and self.prompt_ids is None:
            prompt_ids = chunk.get("prompt_token_ids")
            if isinstance(prompt_ids, list):
                self.prompt_ids = prompt_ids
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if "error" in chunk:
            self.error = chunk["error"]
        choice = choice0(chunk)
        if choice is None:
            return False
        ids = choice.get("token_ids")
        if self.api_type == CHAT:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if delta.get("tool_calls"):
                self._merge_tool_calls(delta["tool_calls"])
            values = chat_logprobs(choice.get("logprobs"))
        else:
            prompt_ids = choice.get("prompt_token_ids")
            if self.prompt_ids is None and isinstance(prompt_ids, list):
                self.prompt_ids = prompt_ids
            text = choice.get("text")
            values = completion_logprobs(choice.get("logprobs"))
        if text:
            self.text.append(text)
        if ids:
            self.completion_ids.extend(ids)
            if values is None or len(values) != len(ids):
                self.logprobs_missing = True
            else:
                self.logprobs.extend(values)
        if (ids or text) and not self.saw_tokens:
            self.saw_tokens = first = True
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        return first

    def _merge_tool_calls(self, deltas: list[Any]) -> None:
        for delta in deltas:
            if not isinstance(delta, dict):
                continue
            call = self.tool_calls.setdefault(
                delta.get("index", 0), {"id": None, "name": "", "arguments": ""}
            )
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["name"] += function.get("name") or ""
            call["arguments"] += function.get("arguments") or ""

    def result(self) -> Capture:
        ids = self.completion_ids
        return Capture(
            prompt_ids=self.prompt_ids,
            completion_ids=ids,
            logprobs=None if self.logprobs_missing else aligned(self.logprobs, len(ids)),
            finish_reason=self.finish_reason,
        )

    def summary(self) -> dict[str, Any]:
        """The `response` stored for a stream: what the agent saw, assembled."""
        usage = self.usage
        if usage is None and self.prompt_ids is not None:
            prompt, completion = len(self.prompt_ids), len(self.completion_ids)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        out: dict[str, Any] = {
            "text": "".join(self.text),
            "finish_reason": self.finish_reason,
            "usage": usage,
        }
        if self.tool_calls:
            out["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        if self.error is not None:
            out["error"] = self.error
        return out


def stream_capture(api_type: str) -> StreamCapture:
    return StreamCapture(api_type)
