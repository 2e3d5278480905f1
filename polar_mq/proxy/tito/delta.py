"""The ids a token prompt appends after the last completion, rendered by the model's template.

The engine's own `/tokenize` renders chat messages with the served model's chat template and
tokenizer (nothing is downloaded, nothing re-implemented). New messages are rendered after a fixed
stand-in conversation (`BASE`: one user and one assistant turn) and the stand-in's ids are cut
off, so the delta is what the template appends after *an* assistant turn, whatever came before
(system prompt and tools render in both and cancel out). The boundary: the template closes an
assistant turn with its tail (SmolLM2/Qwen: `<|im_end|>` `\\n`); the completion already holds the
part of the tail the model sampled (its end-of-turn token), and only the rest is added. A template
that is not incremental (the stand-in's ids are not a prefix) is refused, and the call goes the
chat way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from polar_mq.proxy.backends.backend import Backend
from polar_mq.proxy.tito.history import tools_digest

BASE: list[dict[str, Any]] = [
    {"role": "user", "content": "."},
    {"role": "assistant", "content": "."},
]
NOT_INCREMENTAL = "template_not_incremental"
TOKENIZE_FAILED = "tokenize_failed"
MAX_CACHED = 64


class DeltaError(Exception):
    """The delta cannot be built (the reason is the fallback recorded with the call)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Frame:
    """The stand-in conversation's ids, closed and open (per tool set: tools render in it)."""

    closed: list[int]
    tail: list[int]
    """What the template writes after an assistant turn's content (`<|im_end|>\\n`)."""


def boundary(context: list[int], tail: list[int]) -> list[int]:
    """The part of `tail` the last completion (the end of `context`) did not sample itself."""
    for m in range(len(tail), 0, -1):
        if len(context) >= m and context[len(context) - m :] == tail[:m]:
            return tail[m:]
    return list(tail)


class DeltaRenderer:
    """Turns new messages into ids with one `/tokenize` call (the stand-in cached per tool set)."""

    def __init__(self) -> None:
        self._frames: dict[bytes, Frame] = {}

    async def _tokenize(
        self, engine: Backend, model: Any, messages: list[Any], tools: Any, **flags: bool
    ) -> list[int]:
        asked: dict[str, Any] = {"messages": messages, **flags}
        if tools:
            asked["tools"] = tools
        if model is not None:
            asked["model"] = model
        try:
            response = await engine.post_small("/tokenize", orjson.dumps(asked))
        except httpx.HTTPError as exc:
            raise DeltaError(TOKENIZE_FAILED, type(exc).__name__) from exc
        if response.status_code != 200:
            raise DeltaError(TOKENIZE_FAILED, f"status {response.status_code}")
        try:
            tokens = orjson.loads(response.content).get("tokens")
        except (orjson.JSONDecodeError, AttributeError):
            tokens = None
        if not isinstance(tokens, list):
            raise DeltaError(TOKENIZE_FAILED, "no tokens in the answer")
        return tokens

    async def frame(self, engine: Backend, model: Any, tools: Any) -> Frame:
        key = tools_digest([model, tools])
        frame = self._frames.get(key)
        if frame is not None:
            return frame
        closed = await self._tokenize(engine, model, BASE, tools, add_generation_prompt=False)
        opened = await self._tokenize(
            engine, model, BASE, tools, add_generation_prompt=False, continue_final_message=True
        )
        if closed[: len(opened)] != opened:
            raise DeltaError(NOT_INCREMENTAL, "closing a turn changes its ids")
        frame = Frame(closed, closed[len(opened) :])
        if len(self._frames) >= MAX_CACHED:
            self._frames.clear()
        self._frames[key] = frame
        return frame

    async def prompt(
        self,
        engine: Backend,
        model: Any,
        context: list[int],
        added: list[Any],
        tools: Any,
    ) -> list[int]:
        """`context` (last prompt + completion) + the tail's rest + the new messages' ids."""
        frame = await self.frame(engine, model, tools)
        full = await self._tokenize(
            engine, model, [*BASE, *added], tools, add_generation_prompt=True
        )
        n = len(frame.closed)
        if full[:n] != frame.closed:
            raise DeltaError(NOT_INCREMENTAL, "new messages change the ids before them")
        return [*context, *boundary(context, frame.tail), *full[n:]]
