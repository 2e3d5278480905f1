"""The futures a call writer's waiters hold, settled from its thread on their serving loop.

A flush() or durable() awaits a future on the proxy's event loop; the writer thread decides when
it is settled and hands that to the loop (`loop.call_soon_threadsafe`). These are the callbacks
it hands over, and the record a flush() waits with.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class FlushWaiter:
    """A flush() waiting for the first `target` rows submitted to be in the database."""

    target: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    journal_mark: int | None = None
    """The journal's `journaled_total` once the target rows were kept: what must be settled."""


def expire(future: asyncio.Future[None]) -> None:
    """A durable() wait that ran out (its waiter entry is settled later, a no-op then)."""
    if not future.done():
        future.set_exception(TimeoutError())


def resolve_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


def resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
