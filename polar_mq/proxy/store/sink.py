"""Where the proxy puts call rows: the `CallSink` interface and an in-memory sink.

The database writer (`writer.DbCallWriter`) is the production sink; `MemoryCallSink` keeps rows in
a list for tests and for benchmarks that leave the database out.
"""

from __future__ import annotations

from typing import Any, Protocol


class CallSink(Protocol):
    """Where the proxy puts call rows. `submit` runs on the event loop and must never block."""

    async def start(self) -> None: ...

    def submit(self, row: dict[str, Any]) -> None: ...

    async def flush(self) -> int:
        """Wait until every row submitted before this call is stored; return rows written."""
        ...

    async def durable(self) -> None:
        """Wait until every row submitted so far survives a crash of this process (committed,
        or spilled to local disk): awaited before an answer leaves the proxy (`writer`)."""
        ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class SinkWrapper:
    """A sink that hands every row on to `inner`: wrappers that only look at the rows (the call
    log, the token budgets) override `submit` and keep the rest."""

    def __init__(self, inner: CallSink) -> None:
        self.inner = inner

    async def start(self) -> None:
        await self.inner.start()

    def submit(self, row: dict[str, Any]) -> None:
        self.inner.submit(row)

    async def flush(self) -> int:
        return await self.inner.flush()

    async def durable(self) -> None:
        await self.inner.durable()

    async def close(self) -> None:
        await self.inner.close()

    def stats(self) -> dict[str, int]:
        return self.inner.stats()


class MemoryCallSink:
    """Keeps rows in a list: for tests and for benchmarks that leave the database out."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    async def start(self) -> None:
        return None

    def submit(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    async def flush(self) -> int:
        return len(self.rows)

    async def durable(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        return {"written": len(self.rows), "dropped": 0, "failed": 0, "pending": 0}
