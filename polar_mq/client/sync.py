"""`Client`: the blocking face of the client core (httpx.Client, time.sleep).

Each method is the core operation of the same name, carried out step by step (`steps.py`); only
`wait` adds something of its own, the progress bar.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from polar_mq.client.core import DEFAULT_TIMEOUT_S, ClientCore, headers
from polar_mq.client.errors import PolarMQError
from polar_mq.client.progress import job_progress
from polar_mq.client.steps import Call, Emit, Op, Sleep, Stepper, Stream, decode, unreachable
from polar_mq.tls import client_ssl_context

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


def _blocking(
    op: Callable[Concatenate[ClientCore, P], Op[T]],
) -> Callable[Concatenate[Client, P], T]:
    """The core operation `op` as a method that returns its result."""

    @functools.wraps(op)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(self._core, *args, **kwargs))

    return method


def _iterating(
    op: Callable[Concatenate[ClientCore, P], Stream[I]],
) -> Callable[Concatenate[Client, P], Iterator[I]]:
    """The streaming core operation `op` as a method returning an iterator of its items."""

    @functools.wraps(op)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[I]:
        return self._drive(Stepper(op(self._core, *args, **kwargs)))

    return method


class Client:
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

    submit = _blocking(ClientCore.submit)
    submit_spec = _blocking(ClientCore.submit_spec)
    status = _blocking(ClientCore.status)
    cancel = _blocking(ClientCore.cancel)
    cancel_rollout = _blocking(ClientCore.cancel_rollout)
    jobs = _blocking(ClientCore.jobs)

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

    iter_pages = _iterating(ClientCore.iter_pages)
    iter_results = _iterating(ClientCore.iter_results)
    results = _blocking(ClientCore.results)
    iter_groups = _iterating(ClientCore.iter_groups)
    export = _blocking(ClientCore.export)

    policy = _blocking(ClientCore.policy)
    set_policy = _blocking(ClientCore.set_policy)
    resume_policy = _blocking(ClientCore.resume_policy)

    lease_groups = _blocking(ClientCore.lease_groups)
    ack_groups = _blocking(ClientCore.ack_groups)
    extend_leases = _blocking(ClientCore.extend_leases)
    stream_groups = _iterating(ClientCore.stream_groups)

    rollout = _blocking(ClientCore.rollout)
    trajectory = _blocking(ClientCore.trajectory)
    calls = _blocking(ClientCore.calls)
    artifacts = _blocking(ClientCore.artifacts)
    artifact = _blocking(ClientCore.artifact)
    save_artifacts = _blocking(ClientCore.save_artifacts)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
