"""The engine's completion as the chat answer the agent asked for, streamed or not.

The agent sees the same shape as on the chat path: `chat.completion` (or its chunks) with the
text as content, tool calls parsed out of it (`tool_parsers`), the finish reason `tool_calls`
when it called one, its own model name, usage, and token ids or logprobs only when it asked for
them. What the agent got is also what its next call must repeat (`reply`), and the call's
prompt + completion ids what the next prompt starts with (`context`).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from polar_mq.proxy.apis.base import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    StreamTranslator,
    sse_event,
)
from polar_mq.proxy.engines.base import View, choice0
from polar_mq.proxy.tito.tool_parsers import Parsed, ToolParser

STREAM_MEDIA_TYPE = "text/event-stream"


def chat_id(completion_id: Any) -> str:
    text = str(completion_id or "")
    return "chatcmpl-" + text.removeprefix("cmpl-")


def finish_of(finish: Any, parsed: Parsed) -> Any:
    return FINISH_TOOL_CALLS if parsed.tool_calls and finish == FINISH_STOP else finish


def reply_message(parsed: Parsed) -> dict[str, Any]:
    """The assistant message the agent receives (and must send back unchanged)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return message


def chat_logprobs(logprobs: Any) -> dict[str, Any] | None:
    """Completions logprobs (`tokens`, `token_logprobs`, `top_logprobs`) in chat's shape."""
    if not isinstance(logprobs, dict):
        return None
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    content = []
    for token, value, top in zip(tokens, values, tops, strict=False):
        alternatives = [{"token": t, "logprob": v, "bytes": None} for t, v in (top or {}).items()]
        content.append(
            {"token": token, "logprob": value, "bytes": None, "top_logprobs": alternatives}
        )
    return {"content": content}


class Answerer:
    """One call's conversion: what the agent asked to see, and how to read tool calls."""

    def __init__(self, view: View, parser: ToolParser | None) -> None:
        self.view = view
        self.parser = parser
        """None: no tools offered (or `tool_choice: none`), the text is all content."""
        self._parsed: tuple[str, Parsed] | None = None

    def parse(self, text: str) -> Parsed:
        """Parsed once per call: the stored answer and the agent's share the tool call ids."""
        if self._parsed is not None and self._parsed[0] == text:
            return self._parsed[1]
        parsed = self.parser.parse(text) if self.parser is not None else Parsed(text)
        self._parsed = (text, parsed)
        return parsed

    def render(
        self, data: dict[str, Any], stored: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The chat answer to a non-streamed completion, and the reply message in it.

        `stored`: the answer as the call's row keeps it (vLLM's chat answer with its ids and
        logprobs, the served model), not as the agent sees it."""
        choice = choice0(data) or {}
        parsed = self.parse(str(choice.get("text") or ""))
        message = {**reply_message(parsed), "reasoning": None}
        show_logprobs = stored or self.view.logprobs
        out_choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs(choice.get("logprobs")) if show_logprobs else None,
            "finish_reason": finish_of(choice.get("finish_reason"), parsed),
            "stop_reason": choice.get("stop_reason"),
        }
        model = self.view.agent_model
        answer: dict[str, Any] = {
            "id": chat_id(data.get("id")),
            "object": "chat.completion",
            "created": data.get("created", int(time.time())),
            "model": model if model is not None and not stored else data.get("model"),
            "choices": [out_choice],
            "usage": data.get("usage"),
        }
        if stored or self.view.token_ids:
            answer["prompt_token_ids"] = choice.get("prompt_token_ids")
            out_choice["token_ids"] = choice.get("token_ids")
        return answer, reply_message(parsed)

    def stored_summary(self, summary: dict[str, Any], reply: dict[str, Any] | None) -> Any:
        """A stream's stored summary in chat's form: the text without tool-call markup, and the
        tool calls the agent was sent."""
        if reply is None:
            parsed = self.parse(str(summary.get("text") or ""))
            reply = reply_message(parsed)
        else:
            parsed = Parsed(reply.get("content"), reply.get("tool_calls") or [])
        out = {**summary, "text": reply.get("content") or ""}
        out["finish_reason"] = finish_of(summary.get("finish_reason"), parsed)
        if parsed.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in parsed.tool_calls
            ]
        return out


class TitoStream:
    """Completion chunks → chat chunks. Text streams as it comes until the parser's start marker
    may begin; from there it is held and parsed when the completion ends (tool calls then arrive
    whole, one delta each, as a chat client accepts).

    `outer`: the agent's API family's translator, fed the chat chunks (Messages, Responses,
    Gemini); without one they go out as chat's own SSE events."""

    def __init__(self, answerer: Answerer, outer: StreamTranslator | None = None) -> None:
        self._outer = outer
        self.media_type = outer.media_type if outer is not None else STREAM_MEDIA_TYPE
        self._answerer = answerer
        self._view = answerer.view
        self._head: dict[str, Any] | None = None
        self._text: list[str] = []
        self._held = ""
        self._holding = False
        self._finish: Any = None
        self._usage: Any = None
        self.reply: dict[str, Any] | None = None
        """The reply message, once the stream ended (`done`)."""
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] = []

    def _emit(self, chunk: dict[str, Any]) -> bytes:
        if self._outer is not None:
            return self._outer.chunk(chunk)
        return sse_event(None, orjson.dumps(chunk))

    def _chunk(self, delta: dict[str, Any], finish: Any = None, **extra: Any) -> bytes:
        assert self._head is not None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
        return self._emit({**self._head, "choices": [choice]})

    def _start(self, data: dict[str, Any]) -> bytes:
        """The first chunk (the role). Like vLLM's, it carries the prompt ids when the agent
        asked for ids, or when a family translates the stream (its token counts come from them;
        the family never shows them)."""
        model = self._view.agent_model if self._view.agent_model is not None else data.get("model")
        self._head = {
            "id": chat_id(data.get("id")),
            "object": "chat.completion.chunk",
            "created": data.get("created", int(time.time())),
            "model": model,
        }
        first = {"role": "assistant", "content": ""}
        if self.prompt_ids is None or (self._outer is None and not self._view.token_ids):
            return self._chunk(first)
        choice = {"index": 0, "delta": first, "logprobs": None, "finish_reason": None}
        return self._emit({**self._head, "choices": [choice], "prompt_token_ids": self.prompt_ids})

    def _release(self, text: str) -> str:
        """The part of `text` that can go out now (the rest may open a tool call)."""
        parser = self._answerer.parser
        if parser is None:
            return text
        self._held += text
        if self._holding:
            return ""
        at = self._held.find(parser.start)
        if at >= 0:
            self._holding = True
            out, self._held = self._held[:at], self._held[at:]
            return out
        keep = 0
        for k in range(min(len(parser.start) - 1, len(self._held)), 0, -1):
            if parser.start.startswith(self._held[-k:]):
                keep = k
                break
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return out

    def chunk(self, data: dict[str, Any]) -> bytes:
        choice = choice0(data)
        if choice is not None and self.prompt_ids is None:
            prompt_ids = choice.get("prompt_token_ids")
            self.prompt_ids = prompt_ids if isinstance(prompt_ids, list) else None
        out = b"" if self._head is not None else self._start(data)
        if data.get("usage"):
            self._usage = data["usage"]
        if choice is None:
            return out
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.completion_ids.extend(ids)
        text = str(choice.get("text") or "")
        self._text.append(text)
        now = self._release(text)
        if now:
            extra = {"token_ids": ids} if self._view.token_ids else {}
            out += self._chunk({"content": now}, **extra)
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return out

    def done(self) -> bytes:
        out = self._start({}) if self._head is None else b""
        parsed = self._answerer.parse("".join(self._text))
        self.reply = reply_message(parsed)
        if parsed.tool_calls:  # the held text was the tool calls
            for index, call in enumerate(parsed.tool_calls):
                out += self._chunk({"tool_calls": [{"index": index, **call}]})
        elif self._held:
            out += self._chunk({"content": self._held})
        self._held = ""
        out += self._chunk({}, finish_of(self._finish, parsed))
        if self._usage is not None:
            assert self._head is not None
            out += self._emit({**self._head, "choices": [], "usage": self._usage})
        if self._outer is not None:
            return out + self._outer.done()
        return out + b"data: [DONE]\n\n"

    def fail(self, message: str) -> bytes:
        if self._outer is not None:
            return self._outer.fail(message)
        error = {"message": message, "type": "upstream_error", "code": "bad_gateway"}
        return sse_event(None, orjson.dumps({"error": error}))
