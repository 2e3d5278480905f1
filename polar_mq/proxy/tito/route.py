"""The hook on the chat route: decide per call between a token prompt and the chat path.

`Tito.prepare` runs after the call is numbered: it loads the rollout attempt's last turn, checks
that the agent's messages extend it (`history`), builds the token prompt (`delta`) and the
completions body (`request`), and sets the call up to be answered in chat's shape (`family`).
Every chat call, whichever way it went, leaves its turn behind (`CallContext.on_answered`, awaited
before the end of the answer reaches the agent) so the next call can go token-in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from polar_mq.config import Settings
from polar_mq.proxy.apis.base import TranslatedCall, Translation
from polar_mq.proxy.backends import Backend, BackendPool, BackendUnavailable
from polar_mq.proxy.backends.backend import upstream_base_url
from polar_mq.proxy.engines.base import COMPLETIONS, Capture
from polar_mq.proxy.engines.sglang_generate import GENERATE_PATH, GenerateAnswer, generate_body
from polar_mq.proxy.store.record import CallContext
from polar_mq.proxy.tito.answer import Answerer
from polar_mq.proxy.tito.delta import DeltaError, DeltaRenderer
from polar_mq.proxy.tito.family import TitoFamily
from polar_mq.proxy.tito.history import Turn, hashed, new_messages, normalize
from polar_mq.proxy.tito.request import completions_body, unsupported
from polar_mq.proxy.tito.store import LastTurn, LocalTurns, RedisTurns, TurnStore
from polar_mq.proxy.tito.tool_parsers import ToolParser, get_parser

logger = logging.getLogger(__name__)

TITO = "tito"
COMPLETIONS_PATH = "/v1/completions"
STORE_UNAVAILABLE = "store_unavailable"
TOKEN_PROMPT_ENGINES = ("vllm", "sglang")
"""Engines that take token-id prompts and return the sampled ids: vLLM's `/v1/completions`,
SGLang's native `/generate` with `input_ids` (`engines.sglang_generate`)."""


def _check_mode(mode: str, engine: str, what: str) -> bool:
    """Whether `mode` serves calls token-in on `engine`; `on` where it cannot is refused."""
    able = engine in TOKEN_PROMPT_ENGINES
    if mode == "on" and not able:
        raise ValueError(
            f"{what}=on needs an engine that takes token prompts ({TOKEN_PROMPT_ENGINES}); "
            f"upstream_engine is {engine!r}"
        )
    return mode == "on" or (mode == "auto" and able)


def tito_enabled(settings: Settings) -> bool:
    """Whether the proxy serves chat calls token-in/token-out by default; `on` with an engine
    that takes no token prompts is refused at boot (never silently off), for the proxy's
    default and for each backend's own setting (`proxy_tito_backends`)."""
    engine = settings.upstream_engine
    for name, mode in settings.proxy_tito_backends.items():
        _check_mode(mode, engine, f"proxy_tito_backends[{name!r}]")
    get_parser(settings.proxy_tito_tool_parser)
    return _check_mode(settings.proxy_tito, engine, "proxy_tito")


def tito_wanted(settings: Settings) -> bool:
    """Whether any backend may serve calls token-in (the proxy's default or a backend's own)."""
    engine = settings.upstream_engine
    backends = settings.proxy_tito_backends.values()
    return tito_enabled(settings) or any(_check_mode(m, engine, "tito") for m in backends)


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """Where a token-in call goes and what it sends."""

    path: str
    body: dict[str, Any]


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

    def __init__(
        self,
        store: TurnStore,
        parser: ToolParser,
        engine: str = "vllm",
        default: bool = True,
        backends: dict[str, str] | None = None,
    ) -> None:
        self.store = store
        self.parser = parser
        self.engine = engine
        self.default = default
        """The proxy's own setting (`proxy_tito`) resolved for the engine."""
        self.backends = dict(backends or {})
        """Per backend name: its own `tito` (auto | on | off), over the proxy's default."""
        self.renderer = DeltaRenderer()

    @classmethod
    def from_settings(cls, settings: Settings) -> Tito | None:
        """None when no backend can serve a call token-in (nothing of TITO runs then)."""
        if not tito_wanted(settings):
            return None
        url = settings.proxy_seq_redis_url  # set when several processes share the rollouts
        store: TurnStore
        if url is not None:
            store = RedisTurns(url, settings.rollout_token_ttl_s + 3600)
        else:
            store = LocalTurns()
        return cls(
            store,
            get_parser(settings.proxy_tito_tool_parser),
            settings.upstream_engine,
            tito_enabled(settings),
            {upstream_base_url(k): v for k, v in settings.proxy_tito_backends.items()},
        )

    def check_mode(self, mode: str) -> None:
        """ValueError for `on` on an engine that takes no token prompts."""
        _check_mode(mode, self.engine, "tito")

    def set_backend(self, name: str, mode: str | None) -> None:
        """A backend's own setting (admin `add`); None: the proxy's default."""
        if mode is None:
            self.backends.pop(name, None)
            return
        self.check_mode(mode)
        self.backends[name] = mode

    def serves(self, backend: Backend) -> bool:
        """Whether calls on `backend` go token-in (when they extend the last turn)."""
        mode = self.backends.get(backend.name)
        if mode is None:
            return self.default
        return _check_mode(mode, self.engine, "tito")

    async def backend_for(self, pool: BackendPool, call: CallContext) -> Backend | None:
        """The backend the call will be sent to (the rollout's sticky one), when TITO may serve
        it there; None: the chat path. With every backend on the proxy's default, no lookup."""
        if not self.backends:
            return pool.primary if self.default else None
        try:
            backend = await pool.choose(call.rollout_id)  # binds as the send would
        except BackendUnavailable:
            return None  # the send answers the agent's 503
        return backend if self.serves(backend) else None

    async def aclose(self) -> None:
        await self.store.aclose()

    async def route(
        self, pool: BackendPool, call: CallContext, chat: dict[str, Any]
    ) -> TokenPrompt | None:
        """The token prompt to send for `call` (then answered as chat), or None: the chat path
        (the backend's TITO setting is off, or the call does not extend the last turn)."""
        backend = await self.backend_for(pool, call)
        if backend is None:
            return None
        return await self.prepare(backend, call, chat)

    async def prepare(
        self, engine: Backend, call: CallContext, chat: dict[str, Any]
    ) -> TokenPrompt | None:
        """The token prompt for `call` (then answered as chat), or None: chat path.

        `chat` is the engine's chat request (served model, sampling enforced); `engine` serves
        the model (its `/tokenize` renders the new messages)."""
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
                engine, chat.get("model"), last.context, added, tools
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
        body = completions_body(chat, prompt)
        if self.engine != "sglang":
            return TokenPrompt(COMPLETIONS_PATH, body)
        options = chat.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        answer = GenerateAnswer(prompt, chat.get("model"), usage)
        call.adapt_answer = answer.chunk if call.stream else answer.answer
        return TokenPrompt(GENERATE_PATH, generate_body(body))

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


__all__ = ["TITO", "Tito", "TokenPrompt", "tito_enabled", "tito_wanted"]
