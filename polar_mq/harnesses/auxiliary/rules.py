"""The rules that recognise a side call, and their matching against a chat request.

A rule matches when every condition it sets holds; a call is auxiliary when any rule matches.
Imports nothing of the database, so harness definitions and the scripted policy stay light.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AuxiliaryRule(BaseModel):
    """One way to recognise a side call; set at least one condition.

    `system_contains` / `user_contains`: a substring of the system prompt / the last user message;
    `max_tokens_at_most`: the call asks for at most this many tokens; `no_tools`: the call offers
    no tools (True) or does (False).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    system_contains: str | None = Field(default=None, min_length=1)
    user_contains: str | None = Field(default=None, min_length=1)
    max_tokens_at_most: int | None = Field(default=None, ge=1)
    no_tools: bool | None = None

    def model_post_init(self, _context: Any) -> None:
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise ValueError("an auxiliary-call rule needs at least one condition")

    def matches(self, call: CallShape) -> bool:
        if self.system_contains is not None and self.system_contains not in call.system:
            return False
        if self.user_contains is not None and self.user_contains not in call.last_user:
            return False
        if self.max_tokens_at_most is not None and (
            call.max_tokens is None or call.max_tokens > self.max_tokens_at_most
        ):
            return False
        return self.no_tools is None or self.no_tools == (not call.has_tools)


@dataclass(frozen=True, slots=True)
class CallShape:
    """The parts of a chat request the rules look at."""

    system: str
    last_user: str
    max_tokens: int | None
    has_tools: bool

    @classmethod
    def of(cls, request: Mapping[str, Any]) -> CallShape:
        messages: Sequence[Any] = request.get("messages") or []
        system = "\n".join(
            content_text(m.get("content"))
            for m in messages
            if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
        )
        last_user = ""
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == "user":
                last_user = content_text(message.get("content"))
                break
        budget = request.get("max_completion_tokens") or request.get("max_tokens")
        return cls(
            system=system,
            last_user=last_user,
            max_tokens=budget if isinstance(budget, int) else None,
            has_tools=bool(request.get("tools") or request.get("functions")),
        )


def content_text(content: Any) -> str:
    """Text of a chat message `content`: a string, None, or a list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def parse_rules(raw: object) -> tuple[AuxiliaryRule, ...]:
    """A job's `auxiliary_calls` list (ValueError on a bad one: a 4xx at submission)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("harness 'auxiliary_calls' must be a list of rules")
    return tuple(AuxiliaryRule.model_validate(item) for item in raw)


def is_auxiliary(request: Mapping[str, Any], rules: Iterable[AuxiliaryRule]) -> bool:
    """True when any rule recognises the chat request as a side call."""
    shape = CallShape.of(request)
    return any(rule.matches(shape) for rule in rules)
