"""The list of client operations, written once for both faces.

`Operations` names every core operation as a descriptor; read on a `Client` it is a method that
returns the result, on an `AsyncClient` a coroutine method, and a streaming one an iterator or an
async iterator (each face says how in `_bind` / `_bind_stream`). The overloads of `__get__` keep
both faces fully typed: before, each face listed the same thirty operations itself.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from polar_mq.client.core import ClientCore
from polar_mq.client.steps import Op, Stream

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the item type of a stream


class SyncFace:
    """The blocking face (`Client`): an operation read on it returns its result. A marker the
    overloads below dispatch on, so this module never imports the faces (no import cycle)."""


class AsyncFace:
    """The asyncio face (`AsyncClient`): an operation read on it is a coroutine method."""


class Operation(Generic[P, T]):
    """A core operation returning a result: `Client.x(...) -> T`, `AsyncClient.x(...)` awaits."""

    def __init__(self, op: Callable[Concatenate[ClientCore, P], Op[T]]) -> None:
        self.op = op
        self.__doc__ = op.__doc__  # help(Client) shows the operation's docstring

    @overload
    def __get__(self, obj: None, owner: type) -> Operation[P, T]: ...
    @overload
    def __get__(self, obj: SyncFace, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: AsyncFace, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return functools.wraps(self.op)(obj._bind(self.op))


class StreamOperation(Generic[P, I]):
    """A streaming core operation: an iterator on `Client`, an async iterator on `AsyncClient`."""

    def __init__(self, op: Callable[Concatenate[ClientCore, P], Stream[I]]) -> None:
        self.op = op
        self.__doc__ = op.__doc__  # help(Client) shows the operation's docstring

    @overload
    def __get__(self, obj: None, owner: type) -> StreamOperation[P, I]: ...
    @overload
    def __get__(self, obj: SyncFace, owner: type) -> Callable[P, Iterator[I]]: ...
    @overload
    def __get__(self, obj: AsyncFace, owner: type) -> Callable[P, AsyncIterator[I]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return functools.wraps(self.op)(obj._bind_stream(self.op))


class Operations:
    """Every operation both faces offer (`wait` is each face's own: the sync one draws a bar)."""

    submit = Operation(ClientCore.submit)
    submit_spec = Operation(ClientCore.submit_spec)
    status = Operation(ClientCore.status)
    cancel = Operation(ClientCore.cancel)
    cancel_rollout = Operation(ClientCore.cancel_rollout)
    jobs = Operation(ClientCore.jobs)

    iter_pages = StreamOperation(ClientCore.iter_pages)
    iter_results = StreamOperation(ClientCore.iter_results)
    results = Operation(ClientCore.results)
    iter_groups = StreamOperation(ClientCore.iter_groups)
    export = Operation(ClientCore.export)

    policy = Operation(ClientCore.policy)
    set_policy = Operation(ClientCore.set_policy)
    resume_policy = Operation(ClientCore.resume_policy)

    lease_groups = Operation(ClientCore.lease_groups)
    ack_groups = Operation(ClientCore.ack_groups)
    extend_leases = Operation(ClientCore.extend_leases)
    stream_groups = StreamOperation(ClientCore.stream_groups)

    rollout = Operation(ClientCore.rollout)
    trajectory = Operation(ClientCore.trajectory)
    calls = Operation(ClientCore.calls)
    artifacts = Operation(ClientCore.artifacts)
    artifact = Operation(ClientCore.artifact)
    save_artifacts = Operation(ClientCore.save_artifacts)
