"""What a builder consumes and produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class CapturedCall:
    """One LLM call as the proxy stored it (the builder's input)."""

    seq: int
    call_id: str
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    policy_version: int
    status_code: int
    request: dict[str, Any]
    response: dict[str, Any] | None
    prompt_source: str = "chat"
    """`tito`: the proxy built the prompt from the previous call's ids (`polar_mq.proxy.tito`)."""
    tito_fallback: str | None = None
    """Why the proxy sent a call the chat way though token-in/token-out was on."""


@dataclass(slots=True)
class BuiltSample:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    messages: list[Any] | None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class BuildResult:
    samples: list[BuiltSample]
    stats: dict[str, Any]


class Builder(Protocol):
    name: str

    def build(self, calls: list[CapturedCall]) -> BuildResult: ...
