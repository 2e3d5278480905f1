"""The text of token ids, for showing a trajectory as the model saw and wrote it.

The database stores token ids, never re-tokenized text (SPEC §5), so the dashboard needs each id's
string. Two sources, cheapest first:

1. the calls' own responses: a non-streamed chat or completions answer with logprobs carries the
   string of every generated token (`logprobs.content[].token`, `logprobs.tokens`), aligned with
   the stored completion ids;
2. the inference engine's `/detokenize` (vLLM, SGLang and the fake engine serve it), one id per
   request, cached for the life of the API process (a vocabulary is a few tens of thousands of
   ids and never changes under a served model). Bounded per page by a time budget; after a
   failure the engine is left alone for a while, and unknown ids are shown as `⟨id⟩`.

Everything returned here is agent- or model-controlled text: templates escape it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import httpx

from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs.read_models import LlmCallRecord

log = logging.getLogger(__name__)

DETOKENIZE_BUDGET_S = 3.0
RETRY_AFTER_FAILURE_S = 30.0
CACHE_MAX = 300_000


def response_token_strings(call: LlmCallRecord) -> dict[int, str]:
    """id -> string for the completion ids of a call whose stored response lists token strings."""
    ids = call.completion_ids or []
    response = call.response if isinstance(call.response, dict) else {}
    choices = response.get("choices")
    if not ids or not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return {}
    logprobs = choices[0].get("logprobs")
    strings: list[Any] = []
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        strings = [e.get("token") if isinstance(e, dict) else None for e in logprobs["content"]]
    elif isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        strings = list(logprobs["tokens"])
    if len(strings) != len(ids):
        return {}
    return {i: s for i, s in zip(ids, strings, strict=True) if isinstance(s, str)}


class TokenDecoder:
    """Id -> text through the engine's `/detokenize`, cached; one per API process (app.state)."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        *,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._clock = clock
        self._transport = transport
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()
        self._down_until = 0.0

    def known(self, ids: Iterable[int]) -> dict[int, str]:
        with self._lock:
            return {i: self._cache[i] for i in ids if i in self._cache}

    def remember(self, strings: dict[int, str]) -> None:
        with self._lock:
            if len(self._cache) + len(strings) > CACHE_MAX:
                self._cache.clear()
            self._cache.update(strings)

    def decode(self, ids: Iterable[int], budget_s: float = DETOKENIZE_BUDGET_S) -> dict[int, str]:
        """The text of as many of `ids` as the cache and the engine give within `budget_s`."""
        wanted = set(ids)
        found = self.known(wanted)
        missing = sorted(wanted - found.keys())
        if not missing or self._clock() < self._down_until:
            return found
        deadline = self._clock() + budget_s
        fetched: dict[int, str] = {}
        try:
            with httpx.Client(
                base_url=self.base_url,
                timeout=self.timeout_s,
                transport=self._transport,
                verify=client_ssl_context(),
            ) as client:
                for token_id in missing:
                    if self._clock() > deadline:
                        break
                    body: dict[str, Any] = {"tokens": [token_id]}
                    if self.model:
                        body["model"] = self.model
                    answer = client.post("/detokenize", json=body)
                    answer.raise_for_status()
                    text = answer.json().get("prompt")
                    if isinstance(text, str):
                        fetched[token_id] = text
        except (httpx.HTTPError, ValueError) as exc:
            log.info("token text unavailable from %s: %s", self.base_url, exc)
            self._down_until = self._clock() + RETRY_AFTER_FAILURE_S
        self.remember(fetched)
        return {**found, **fetched}


def token_texts(
    decoder: TokenDecoder | None, calls: Sequence[LlmCallRecord], ids: Iterable[int]
) -> dict[int, str]:
    """The best known text of each id in `ids` (missing ones are left out)."""
    from_calls: dict[int, str] = {}
    for call in calls:
        from_calls.update(response_token_strings(call))
    wanted = set(ids)
    if decoder is None:
        return {i: from_calls[i] for i in wanted if i in from_calls}
    decoder.remember(from_calls)
    return decoder.decode(wanted)
