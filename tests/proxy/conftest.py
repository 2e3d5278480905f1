"""Proxy fixtures: the proxy in-process, the fake vLLM injected as its transport, rows in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from proxy_support import Harness, proxy_settings, start_harness


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in start_harness(proxy_settings()):
        yield h
