"""What every engine module provides, and the pieces they share.

An engine is a module (`engines.vllm`, `engines.sglang`, `engines.generic`) that satisfies the
`Engine` protocol: it rewrites the agent's request so the inference server returns what training
needs, reads token ids, logprobs and the finish reason back (`extract_response`, `StreamCapture`),
and strips from the agent's view whatever it did not ask for (`visible`, `strip`). The forwarding
code (`polar_mq.proxy.capture`) only talks to this protocol, so adding an engine touches no hot-path
file. `FIDELITY` says how the ids were obtained: "exact" (the ids the engine sampled) or
"retokenized" (text turned back into ids afterwards; see `engines.generic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

CHAT = "chat"
COMPLETIONS = "completions"
EXACT = "exact"
RETOKENIZED = "retokenized"


@dataclass(frozen=True, slots=True)
class View:
    """What the agent asked to see; everything else we added is stripped from its responses."""

    api_type: str
    agent_model: Any
    token_ids: bool
    logprobs: bool
    prompt_logprobs: bool
    kv_transfer: bool
    extras: frozenset[str] = frozenset()
    """Engine-specific response fields the agent asked for itself (e.g. SGLang's `sglext`)."""


@dataclass(slots=True)
class Capture:
    """The training-relevant part of one call, as the engine reported it."""

    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None


class StreamCaptureLike(Protocol):
    """Accumulates one streamed answer (choice 0) chunk by chunk."""

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def error(self) -> Any: ...

    def feed(self, chunk: dict[str, Any]) -> bool:
        """Take one parsed chunk; True when it is the first one that carries generated tokens."""
        ...

    def result(self) -> Capture: ...

    def summary(self) -> dict[str, Any]:
        """The `response` document stored for a stream: what the agent saw, assembled."""
        ...


class Engine(Protocol):
    """The interface of an engine module (modules satisfy protocols structurally)."""

    NAME: str
    FIDELITY: str

    def rewrite_request(
        self, api_type: str, body: dict[str, Any], served_model: str | None
    ) -> tuple[dict[str, Any], View]: ...

    def visible(self, data: dict[str, Any], view: View) -> dict[str, Any]: ...

    def strip(self, data: dict[str, Any], view: View, copy_choices: bool = True) -> None: ...

    def extract_response(self, api_type: str, data: dict[str, Any]) -> Capture: ...

    def stream_capture(self, api_type: str) -> StreamCaptureLike: ...


def choice0(data: dict[str, Any]) -> dict[str, Any] | None:
    """Choice 0 of a response or chunk (the only one captured: agents sample one per call)."""
    for choice in data.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def chat_logprobs(logprobs: Any) -> list[Any] | None:
    """The sampled tokens' logprobs of a chat choice (`logprobs.content[].logprob`)."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    return [entry.get("logprob") if isinstance(entry, dict) else None for entry in content]


def completion_logprobs(logprobs: Any) -> list[Any] | None:
    """The sampled tokens' logprobs of a completions choice (`logprobs.token_logprobs`)."""
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return values if isinstance(values, list) else None


def aligned(values: list[Any] | None, n_ids: int) -> list[float] | None:
    """One float per completion id, or None; with `echo`, prompt entries come first: drop them."""
    if values is None or len(values) < n_ids:
        return None
    tail = values[len(values) - n_ids :]
    try:
        return [float(v) for v in tail]
    except (TypeError, ValueError):  # a null (or garbage) logprob: no usable logprobs
        return None


def int_list(value: Any) -> list[int] | None:
    """`value` if it is a list of ids (what a well-formed engine field holds), else None."""
    return value if isinstance(value, list) else None


class LogprobTrail:
    """The logprobs of a stream's choice 0, for engines whose chunks carry logprobs without ids.

    A chunk with text but no logprobs marks the trail incomplete (then no logprobs are stored).
    """

    __slots__ = ("_chat", "_missing", "_values")

    def __init__(self, api_type: str) -> None:
        self._chat = api_type == CHAT
        self._values: list[Any] = []
        self._missing = False

    def feed(self, choice: dict[str, Any]) -> None:
        if self._chat:
            values = chat_logprobs(choice.get("logprobs"))
            text = (choice.get("delta") or {}).get("content")
        else:
            values = completion_logprobs(choice.get("logprobs"))
            text = choice.get("text")
        if values:
            self._values.extend(values)
        elif text:
            self._missing = True

    def values(self, n_ids: int | None) -> list[float] | None:
        """One float per id (`n_ids`; None: as many as were sent), or None when any is missing."""
        if self._missing or not self._values:
            return None
        return exact_logprobs(self._values, len(self._values) if n_ids is None else n_ids)


def exact_logprobs(values: list[Any] | None, n_ids: int) -> list[float] | None:
    """Logprobs only when there is exactly one per id (no prompt entries to skip)."""
    return aligned(values, n_ids) if values is not None and len(values) == n_ids else None
