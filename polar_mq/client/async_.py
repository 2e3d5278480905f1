"""`AsyncClient`: the asyncio face of the client core (httpx.AsyncClient, asyncio.sleep).

The same operations as `Client` (listed in `operations.py`), each the core operation of the same
name carried out step by step (`steps.py`): coroutines for calls, async iterators for streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from polar_mq.client.core import DEFAULT_TIMEOUT_S, ClientCore, headers
from polar_mq.client.errors import PolarMQError
from polar_mq.client.operations import AsyncFace, Operation, Operations
from polar_mq.client.steps import Call, Emit, Op, Sleep, Stepper, Stream, decode, unreachable
from polar_mq.infra.tls import client_ssl_context

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


class AsyncClient(Operations, AsyncFace):
    """The same API for asyncio trainers: `async with AsyncClient(url) as client: ...`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers(api_key),
            timeout=timeout,
            transport=transport,
            verify=client_ssl_context(),
        )
        self._core = ClientCore(timeout)

    async def _send(self, call: Call) -> Any:
        try:
            response = await self._http.request(call.method, call.path, **call.request_kwargs())
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        return decode(response, call.raw)

    async def _drive(self, stepper: Stepper) -> AsyncGenerator[Any, None]:
        """Perform the operation's steps, yielding the items it emits."""
        try:
            while (step := stepper.next()) is not None:
                if isinstance(step, Emit):
                    yield step.item
                elif isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                else:
                    try:
                        stepper.reply(await self._send(step))
                    except PolarMQError as exc:
                        stepper.fail(exc)
        finally:
            stepper.close()

    async def _run(self, op: Op[T]) -> T:
        stepper = Stepper(op)
        async for _ in self._drive(stepper):
            raise TypeError("a streaming operation run as a call")
        result: T = stepper.result
        return result

    def _bind(
        self, op: Callable[Concatenate[ClientCore, P], Op[T]]
    ) -> Callable[P, Coroutine[Any, Any, T]]:
        """The core operation `op` as a coroutine method that returns its result."""

        async def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self._run(op(self._core, *args, **kwargs))

        return method

    def _bind_stream(
        self, op: Callable[Concatenate[ClientCore, P], Stream[I]]
    ) -> Callable[P, AsyncIterator[I]]:
        """The streaming core operation `op` as a method returning an async iterator."""

        def method(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[I]:
            return self._drive(Stepper(op(self._core, *args, **kwargs)))

        return method

    wait = Operation(ClientCore.wait)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
