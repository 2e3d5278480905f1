"""The sans-IO protocol between the client core and its two faces.

Every client operation is written once (`core.py`, `leases.py`) as a generator that *describes*
its I/O: it yields a `Call` (an HTTP request) and receives the decoded answer, or has the API's
error thrown in; it yields a `Sleep` when it wants to wait; a streaming operation yields an `Emit`
per item it hands to the caller. The sync face (`sync.py`) and the async face (`async_.py`) only
carry these steps out with httpx.Client / time.sleep or httpx.AsyncClient / asyncio.sleep, so
retries, pagination, polling, lease extension and acknowledgement logic exist in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
import orjson

from polar_mq.client.errors import PolarMQError

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the item type of a stream


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request; `raw` asks for the body's bytes instead of its decoded JSON."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    timeout: float | None = None
    """None: the client's default timeout (never "no timeout")."""
    raw: bool = False

    def request_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `httpx.Client.request` / `httpx.AsyncClient.request`."""
        kwargs: dict[str, Any] = {}
        for name in ("params", "json", "content", "headers", "timeout"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        return kwargs


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Emit(Generic[I]):
    """An item a streaming operation hands to its caller (who resumes it by asking the next)."""

    item: I


Step = Call | Sleep | Emit[Any]
Op = Generator[Step, Any, T]
"""An operation: yields steps, is sent each `Call`'s answer, returns its result."""
Stream = Generator[Call | Sleep | Emit[I], Any, None]
"""A streaming operation: its items are the `Emit`s it yields."""


KEY_HINT = "pass api_key= (--api-key on the command line) or set POLAR_MQ_API_KEY"
"""What a 401 tells the user to do: where a client takes its key."""


def decode(response: httpx.Response, raw: bool = False) -> Any:
    """The JSON (or `raw` bytes) of a 2xx response, or the API's error raised as PolarMQError
    (a 401 says where the key goes)."""
    if response.is_success:
        return response.content if raw else orjson.loads(response.content)
    try:
        error = orjson.loads(response.content)["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        kind, message = "http_error", response.text[:500]
    if response.status_code == 401:
        message = f"{message}; {KEY_HINT}"
    raise PolarMQError(response.status_code, kind, message)


def unreachable(exc: httpx.TransportError) -> PolarMQError:
    """A transport failure as the error every client method raises (status 0), naming the URL
    it tried: the first thing to check is that the API runs there."""
    try:
        url = f" at {exc.request.url.copy_with(query=None)}"
    except RuntimeError:  # no request attached
        url = ""
    return PolarMQError(
        0,
        "connection_error",
        f"cannot reach the API{url} ({type(exc).__name__}: {exc}); is it running? "
        "(`polar-mq up` starts one locally)",
    )


class Stepper:
    """Advances one operation: the faces' loop is `next()`, then `reply()` or `fail()`."""

    def __init__(self, op: Generator[Step, Any, Any]) -> None:
        self._op = op
        self._reply: Any = None
        self._error: PolarMQError | None = None
        self.result: Any = None

    def next(self) -> Step | None:
        """The operation's next step, or None once it returned (its value is in `result`)."""
        error, self._error = self._error, None
        try:
            step = self._op.throw(error) if error is not None else self._op.send(self._reply)
        except StopIteration as stop:
            self.result = stop.value
            return None
        self._reply = None
        return step

    def reply(self, answer: Any) -> None:
        self._reply = answer

    def fail(self, error: PolarMQError) -> None:
        self._error = error

    def close(self) -> None:
        """Stop the operation early (a caller left a stream): its `finally`/`with` blocks run."""
        self._op.close()


def answer(call: Call) -> Op[Any]:
    """The operation of one call: its decoded answer."""
    return (yield call)


def answer_dict(call: Call) -> Op[dict[str, Any]]:
    """The operation of one call answered by a JSON object."""
    return dict((yield call))


def emit_all(items: Iterable[T]) -> Generator[Emit[T], Any, None]:
    for item in items:
        yield Emit(item)


def for_each(source: Stream[T], handle: Callable[[T], Generator[Step, Any, None]]) -> Op[None]:
    """Run `source`, running the operation `handle(item)` for each item it emits instead of
    emitting it: how one operation consumes another's stream (results pages → groups)."""
    stepper = Stepper(source)
    try:
        while (step := stepper.next()) is not None:
            if isinstance(step, Emit):
                yield from handle(step.item)
                continue
            try:
                stepper.reply((yield step))
            except PolarMQError as exc:
                stepper.fail(exc)
    finally:
        stepper.close()


def collect(source: Stream[T]) -> Op[list[T]]:
    """Every item `source` emits, as a list."""
    items: list[T] = []

    def keep(item: T) -> Generator[Step, Any, None]:
        items.append(item)
        yield from ()

    yield from for_each(source, keep)
    return items
