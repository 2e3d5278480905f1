"""The generic engine's token ids: a call sink that re-tokenizes rows before they are stored.

It wraps the real sink. A successful call without ids (what `engines.generic` captures) is held
while the prompt and the completion text are sent to the serving backend's `/tokenize` (vLLM and
SGLang style: `{"messages": ...}` or `{"prompt": ...}` in, `{"tokens": [...]}` out), off the
request path, at most `max_concurrent` at a time; then the row, marked `fidelity: "retokenized"`
in its stored `response` document, goes to the wrapped sink. If tokenizing fails the row is
stored anyway, without ids, marked `fidelity: "missing"`. `flush` and `close` wait for rows in
flight, so "flushed" still means "stored".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from polar_mq.proxy.backends.backend import Backend
from polar_mq.proxy.engines.base import CHAT, RETOKENIZED, choice0, exact_logprobs
from polar_mq.proxy.store.writer import CallSink

logger = logging.getLogger(__name__)

MISSING = "missing"
TOKENIZE_PATH = "/tokenize"


TOKENIZE_ATTEMPTS = 3
"""Tries of an idempotent /tokenize call that failed in transport (a pooled keep-alive
connection the server had just closed, a backend restarting): a transient error must not leave a
call's ids `missing` for good."""


class TokenizeError(Exception):
    """The backend could not tokenize (unreachable, refused, or an unexpected answer)."""


class RetokenizingSink:
    def __init__(
        self,
        inner: CallSink,
        backend_for: Callable[[str], Backend],
        max_concurrent: int = 64,
    ) -> None:
        self._inner = inner
        self._backend_for = backend_for
        """A backend by the name stored in the row's `backend`."""
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed = 0

    async def start(self) -> None:
        await self._inner.start()

    def submit(self, row: dict[str, Any]) -> None:
        if not _needs_ids(row):
            self._inner.submit(row)
            return
        task = asyncio.get_running_loop().create_task(self._fill(row))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> int:
        await self.drain()
        return await self._inner.flush()

    async def durable(self) -> None:
        """Rows held for their ids are not submitted yet: they go on first."""
        await self.drain()
        await self._inner.durable()

    async def close(self) -> None:
        await self.drain()
        await self._inner.close()

    def stats(self) -> dict[str, int]:
        return {
            **self._inner.stats(),
            "retokenizing": len(self._tasks),
            "retokenize_failed": self._failed,
        }

    async def drain(self) -> None:
        """Wait until every row held for its ids has gone on to the wrapped sink. The proxy
        drains before it closes the backends' clients, which the lookups use."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _fill(self, row: dict[str, Any]) -> None:
        fidelity = RETOKENIZED
        try:
            # a task group, not `gather`: when one lookup gives up the other is cancelled (its
            # ids are useless then) instead of retrying on after the row was stored
            async with self._slots, asyncio.TaskGroup() as group:
                prompt = group.create_task(self._prompt_ids(row))
                completion = group.create_task(self._completion_ids(row))
        except* TokenizeError as failed:
            self._failed += 1
            fidelity = MISSING
            logger.warning("re-tokenizing call %s failed: %s", row.get("id"), failed.exceptions[0])
        except* Exception:  # a bug of ours must not lose a call the agent already has
            self._failed += 1
            fidelity = MISSING
            logger.exception("re-tokenizing call %s broke", row.get("id"))
        else:
            row["prompt_ids"] = prompt.result()
            row["completion_ids"] = completion_ids = completion.result()
            row["logprobs"] = exact_logprobs(row.get("logprobs"), len(completion_ids))
        row["response"] = {**row["response"], "fidelity": fidelity}  # a copy: never the agent's
        self._inner.submit(row)

    async def _prompt_ids(self, row: dict[str, Any]) -> list[int]:
        request = row["request"]
        if row["api_type"] == CHAT:
            body: dict[str, Any] = {
                "messages": request.get("messages"),
                "add_generation_prompt": True,
            }
            if request.get("tools"):
                body["tools"] = request["tools"]
            return await self._tokenize(row, body)
        prompt = request.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt  # token-in: the ids the engine saw, exactly
        if not isinstance(prompt, str):
            raise TokenizeError("only a single text or token-id prompt can be re-tokenized")
        return await self._tokenize(row, {"prompt": prompt})

    async def _completion_ids(self, row: dict[str, Any]) -> list[int]:
        text = _completion_text(row)
        if not text:
            return []
        return await self._tokenize(row, {"prompt": text, "add_special_tokens": False})

    async def _tokenize(self, row: dict[str, Any], body: dict[str, Any]) -> list[int]:
        if row.get("model"):
            body["model"] = row["model"]
        try:
            backend = self._backend_for(row["backend"])
        except KeyError as exc:  # the backend was removed since
            raise TokenizeError(f"backend {row['backend']!r} is gone") from exc
        content = orjson.dumps(body)
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(TOKENIZE_ATTEMPTS),
                wait=wait_exponential(multiplier=0.05, max=1.0),
                retry=retry_if_exception_type(httpx.TransportError),
                reraise=True,
            ):
                with attempt:
                    response = await backend.post_small(TOKENIZE_PATH, content)
        except httpx.HTTPError as exc:
            raise TokenizeError(f"{type(exc).__name__} calling {TOKENIZE_PATH}") from exc
        if response.status_code != 200:
            raise TokenizeError(f"{TOKENIZE_PATH} answered {response.status_code}")
        try:
            tokens = orjson.loads(response.content).get("tokens")
        except (orjson.JSONDecodeError, AttributeError) as exc:
            raise TokenizeError(f"{TOKENIZE_PATH} answered something other than JSON") from exc
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise TokenizeError(f"{TOKENIZE_PATH} answered without a `tokens` list")
        return tokens


def _needs_ids(row: dict[str, Any]) -> bool:
    """A successful call whose ids the engine did not give (errors have nothing to tokenize)."""
    return (
        isinstance(row.get("response"), dict)
        and 200 <= row["status_code"] < 300
        and row.get("completion_ids") is None
    )


def _completion_text(row: dict[str, Any]) -> str:
    """What the model generated: the stream summary's text, or choice 0 of the JSON body."""
    response = row["response"]
    if row.get("stream"):
        text = response.get("text")
        return text if isinstance(text, str) else ""
    choice = choice0(response) or {}
    if row["api_type"] == CHAT:
        text = (choice.get("message") or {}).get("content")
    else:
        text = choice.get("text")
    return text if isinstance(text, str) else ""
