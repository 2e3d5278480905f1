"""Does an agent's turn extend its previous one? Compared on normalized messages.

An SDK re-sends the reply it got with its own serialization (`refusal: null`, `annotations: []`,
`content: null` beside tool calls), so messages are compared on what the chat template renders:
role, text, tool calls (name and arguments as JSON values) and the other non-null fields. The
previous turn is kept as a digest of its messages and tools plus the normalized reply, never the
whole history.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

FIRST_CALL = "first_call"
HISTORY_REWRITTEN = "history_rewritten"
REPLY_EDITED = "reply_edited"
REPLY_DROPPED = "reply_dropped"
NO_NEW_MESSAGES = "no_new_messages"
TOOLS_CHANGED = "tools_changed"

_IGNORED_ASSISTANT_KEYS = frozenset(
    (
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
        "reasoning_content",
        "provider_specific_fields",
        "thinking_blocks",
    )
)
"""Fields an SDK echoes back that the chat template does not render for an assistant turn
(`provider_specific_fields`, `thinking_blocks`: litellm's, on every message it returns, so
mini-swe-agent, aider and other litellm agents send them back with the reply)."""


def _text(content: Any) -> Any:
    """A message's text when it is text (a string or text parts), else the content as is."""
    if content is None:
        return ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _arguments(arguments: Any) -> Any:
    """Arguments as JSON values: an API family re-serializes them (Anthropic's `input` object)."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _tool_calls(calls: Any) -> list[Any]:
    """Name and arguments of each call. Ids are not compared: a token prompt never re-renders
    the reply, and families give ids of their own (Gemini's calls carry none)."""
    out: list[Any] = []
    for call in calls or ():
        if not isinstance(call, dict):
            out.append(call)
            continue
        function = call.get("function") or {}
        out.append([function.get("name"), _arguments(function.get("arguments"))])
    return out


def normalize(message: Any) -> Any:
    """What of `message` the template renders, in a form equal for equal renderings."""
    if not isinstance(message, dict):
        return message
    role = message.get("role")
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    for key, value in message.items():
        if key in ("role", "content") or value is None:
            continue
        if role == "assistant" and key in _IGNORED_ASSISTANT_KEYS:
            continue
        out[key] = _tool_calls(value) if key == "tool_calls" else value
    if role == "assistant" and not out.get("tool_calls"):
        out.pop("tool_calls", None)
    return out


def tools_digest(tools: Any) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


@dataclass(frozen=True, slots=True)
class History:
    """One call's messages, hashed once: the whole history, and its first `at` messages (what
    the rollout's last turn sent) on the way."""

    messages: list[Any]
    tools_digest: bytes
    full: bytes
    prefix: bytes | None


def hashed(messages: list[Any], tools: Any, at: int | None = None) -> History:
    """Each normalized message is hashed after the tools, in order (a JSON object's text ends
    where it ends, so the concatenation is unambiguous); the digest is read at `at` and at the
    end of one pass."""
    tools_hash = tools_digest(tools)
    state = hashlib.blake2b(tools_hash, digest_size=16)
    prefix = None
    for index, message in enumerate(messages):
        if index == at:
            prefix = state.digest()
        state.update(orjson.dumps(normalize(message), option=orjson.OPT_SORT_KEYS))
    full = state.digest()
    return History(messages, tools_hash, full, full if at == len(messages) else prefix)


def digest(messages: list[Any], tools: Any) -> bytes:
    """A stable hash of normalized `messages` and the `tools` offered with them."""
    return hashed(messages, tools).full


@dataclass(frozen=True, slots=True)
class Turn:
    """What the next call must extend: the messages sent, and the reply as the agent got it."""

    n_messages: int
    messages_digest: bytes
    tools_digest: bytes
    reply: Any
    """`normalize`d assistant message the agent was answered with."""


def new_messages(turn: Turn | None, history: History) -> list[Any] | str:
    """The messages `history` adds after `turn`'s messages and reply, or why it does not extend.

    `history` must be hashed at `turn.n_messages`. Returns a fallback reason (a string) when the
    history was rewritten, the reply edited or dropped (the agent sent something else where its
    reply goes), the tools changed or nothing new was sent."""
    if turn is None:
        return FIRST_CALL
    n = turn.n_messages
    messages = history.messages
    if len(messages) <= n:
        return HISTORY_REWRITTEN
    if history.tools_digest != turn.tools_digest:
        return TOOLS_CHANGED
    if history.prefix != turn.messages_digest:
        return HISTORY_REWRITTEN
    reply = messages[n]
    if not isinstance(reply, dict) or reply.get("role") != "assistant":
        return REPLY_DROPPED  # e.g. mini-swe-agent on a reply without a tool call
    if normalize(reply) != turn.reply:
        return REPLY_EDITED
    added = messages[n + 1 :]
    return added if added else NO_NEW_MESSAGES
