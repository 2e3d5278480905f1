"""The hook on the chat route: decide per call between a token prompt and the chat path.

`Tito.prepare` runs after the call is numbered: it loads the rollout attempt's last turn, checks
that the agent's messages extend it (`history`), builds the token prompt (`delta`) and the
completions body (`request`), and sets the call up to be answered in chat's shape (`family`).
Every chat call, whichever way it went, leaves its turn behind (`CallContext.on_answered`, awaited
before the end of the answer reaches the agent) so the next call can go token-in.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from polar_mq.config import Settings
from polar_mq.proxy.apis.base import TranslatedCall, Translation
from polar_mq.proxy.engines.base import COMPLETIONS, Capture
from polar_mq.proxy.record import CallContext
from polar_mq.proxy.tito.answer import Answerer
from polar_mq.proxy.tito.delta import DeltaError, DeltaRenderer
from polar_mq.proxy.tito.family import TitoFamily
from polar_mq.proxy.tito.history import Turn, hashed, new_messages, normalize
from polar_mq.proxy.tito.request import completions_body, unsupported
from polar_mq.proxy.tito.store import LastTurn, LocalTurns, RedisTurns, TurnStore
from polar_mq.proxy.tito.tool_parsers import ToolParser, get_parser

logger = logging.getLogger(__name__)

TITO = "tito"
STORE_UNAVAILABLE = "store_unavailable"
TOKEN_PROMPT_ENGINES = ("vllm",)
"""Engines whose completions take token-id prompts and return the sampled ids."""


def tito_enabled(settings: Settings) -> bool:
    """Whether the proxy serves chat calls token-in/token-out; `on` with an engine that takes no
    token prompts is refused at boot (never silently off)."""
    mode = settings.proxy_tito
    able = settings.upstream_engine in TOKEN_PROMPT_ENGINES
    if mode == "on" and not able:
        raise ValueError(
            f"proxy_tito=on needs an engine that takes token prompts ({TOKEN_PROMPT_ENGINES}); "
            f"upstream_engine is {settings.upstream_engine!r}"
        )
    get_parser(settings.proxy_tito_tool_parser)
    return mode == "on" or (mode == "auto" and able)


def _reply_of(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The assistant message an answer gave the agent (a chat answer or a stream's summary)."""
    choices = answer.get("choices")
    if isinstance(choices, list):
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        return message if isinstance(message, dict) else None
    if "text" not in answer:
        return None
    reply: dict[str, Any] = {"role": "assistant", "content": answer.get("text") or None}
    calls = answer.get("tool_calls")
    if calls:
        reply["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c.get("name"), "arguments": c.get("arguments")},
            }
            for c in calls
        ]
    return reply


class Tito:
    """The per-process TITO state: where turns are kept, how deltas render, which tool parser."""

    def __init__(self, store: TurnStore, parser: ToolParser) -> None:
        self.store = store
        self.parser = parser
        self.renderer = DeltaRenderer()

    @classmethod
    def from_settings(cls, settings: Settings) -> Tito | None:
        if not tito_enabled(settings):
            return None
        url = settings.proxy_seq_redis_url  # set when several processes share the rollouts
        store: TurnStore
        if url is not None:
            store = RedisTurns(url, settings.rollout_token_ttl_s + 3600)
        else:
            store = LocalTurns()
        return cls(store, get_parser(settings.proxy_tito_tool_parser))

    async def aclose(self) -> None:
        await self.store.aclose()

    async def prepare(
        self, client: httpx.AsyncClient, call: CallContext, chat: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The completions body to send for `call` (then answered as chat), or None: chat path.

        `chat` is the engine's chat request (served model, sampling enforced); `client` reaches
        an engine serving the model (its `/tokenize` renders the new messages)."""
        messages = chat.get("messages")
        if not isinstance(messages, list):
            return None
        tools = chat.get("tools")
        reason = unsupported(chat)
        last = None
        if reason is None:
            try:
                last = await self.store.load(call.rollout_id, call.attempt)
            except Exception as exc:  # Redis unreachable: this call goes the chat way
                logger.warning("tito: turn store unavailable: %r", exc)
                reason = STORE_UNAVAILABLE
        history = hashed(messages, tools, last.turn.n_messages if last else None)
        self._leave_turn(call, len(messages), (history.full, history.tools_digest))
        if reason is not None:
            call.tito_fallback = reason
            return None
        added = new_messages(last.turn if last else None, history)
        if isinstance(added, str):
            call.tito_fallback = added
            return None
        assert last is not None
        try:
            prompt = await self.renderer.prompt(
                client, chat.get("model"), last.context, added, tools
            )
        except DeltaError as exc:
            call.tito_fallback = exc.reason
            return None
        parser = self.parser if tools and chat.get("tool_choice") != "none" else None
        family = TitoFamily(Answerer(call.view, parser), call.translated)
        call.translated = TranslatedCall(family, Translation(chat, call.stream, None))
        call.stored_response = family.stored
        call.engine_api = COMPLETIONS
        call.prompt_source = TITO
        return completions_body(chat, prompt)

    def _leave_turn(self, call: CallContext, n: int, digests: tuple[bytes, bytes]) -> None:
        """Once answered, the call's turn is saved for the next one."""
        store = self.store

        async def answered(capture: Capture, answer: dict[str, Any]) -> None:
            family = call.translated.family if call.translated is not None else None
            reply = family.reply() if isinstance(family, TitoFamily) else _reply_of(answer)
            if capture.prompt_ids is None or capture.completion_ids is None or reply is None:
                return
            turn = Turn(n, digests[0], digests[1], normalize(reply))
            last = LastTurn(turn, [*capture.prompt_ids, *capture.completion_ids])
            try:
                await store.save(call.rollout_id, call.attempt, last)
            except Exception as exc:  # the next call then goes the chat way
                logger.warning("tito: could not keep rollout %s's turn: %r", call.rollout_id, exc)

        call.on_answered = answered


__all__ = ["TITO", "Tito", "tito_enabled"]
