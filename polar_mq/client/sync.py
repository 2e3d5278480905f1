"""`Client`: the blocking face of the client core (httpx.Client, time.sleep).

Each method is the core operation of the same name (listed in `operations.py`), carried out step
by step (`steps.py`); only `wait` adds something of its own, the progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from polar_mq.client.core import DEFAULT_TIMEOUT_S, ClientCore, headers
from polar_mq.client.errors import PolarMQError
from polar_mq.client.operations import Operations, SyncFace
from polar_mq.client.progress import job_progress
from polar_mq.client.steps import Call, Emit, Op, Sleep, Stepper, Stream, decode, unreachable
from polar_mq.infra.tls import client_ssl_context

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


class Client(Operations, SyncFace):
    """Synchronous client: `Client("http://host:8000", api_key=...)`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers(api_key),
            timeout=timeout,
            transport=transport,
            verify=client_ssl_context(),
        )
        self._core = ClientCore(timeout)

    def _send(self, call: Call) -> Any:
        try:
            response = self._http.request(call.method, call.path, **call.request_kwargs())
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        return decode(response, call.raw)

    def _drive(self, stepper: Stepper) -> Generator[Any, None, None]:
        """Perform the operation's steps, yielding the items it emits."""
        try:
            while (step := stepper.next()) is not None:
                if isinstance(step, Emit):
                    yield step.item
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                else:
                    try:
                        stepper.reply(self._send(step))
                    except PolarMQError as exc:
                        stepper.fail(exc)
        finally:
            stepper.close()

    def _run(self, op: Op[T]) -> T:
        stepper = Stepper(op)
        for _ in self._drive(stepper):
            raise TypeError("a streaming operation run as a call")
        result: T = stepper.result
        return result

    def _bind(self, op: Callable[Concatenate[ClientCore, P], Op[T]]) -> Callable[P, T]:
        """The core operation `op` as a method that returns its result (`Operations`)."""

        def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return self._run(op(self._core, *args, **kwargs))

        return method

    def _bind_stream(
        self, op: Callable[Concatenate[ClientCore, P], Stream[I]]
    ) -> Callable[P, Iterator[I]]:
        """The streaming core operation `op` as a method returning an iterator of its items."""

        def method(*args: P.args, **kwargs: P.kwargs) -> Iterator[I]:
            return self._drive(Stepper(op(self._core, *args, **kwargs)))

        return method

    def wait(
        self,
        job_id: str,
        progress: bool = True,
        poll_s: float = 1.0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until every rollout is terminal (or the job is cancelled); the final status.

        Raises TimeoutError after `timeout` seconds. Brief outages of the API are ridden out.
        With `progress`, a progress bar shows the job on the terminal meanwhile.
        """
        if not progress:
            return self._run(self._core.wait(job_id, poll_s, timeout))
        with job_progress(job_id) as show:
            return self._run(self._core.wait(job_id, poll_s, timeout, show))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
