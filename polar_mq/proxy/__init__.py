"""The token-capturing, OpenAI-compatible proxy in front of the inference engines.

`server/` serves it (its own HTTP server, the app and its routes, auth, one process or N),
`apis/` speaks the agents' API families, `engines/` captures each engine's tokens, `tito/` keeps
token-in/token-out, `backends/` routes calls to the engines through its own upstream client, and
`store/` records the calls.

Hot path: `server.app` (routes) -> `server.auth` -> `server.body` -> `engines.<engine>` (rewrite,
extract, strip) -> `backends` (pick a backend, retry before the first byte) -> `capture` (forward,
stream relay) -> `store.writer` (enqueue only; a thread writes batches to the database, spilling
to disk when it is down).

The exports load on first use: a `--workers N` supervisor imports `server.run` and
`server.supervisor` only, never the app (its fork server imports that once for the children).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from polar_mq.proxy.server.app import create_proxy_app
    from polar_mq.proxy.store.writer import CallSink, DbCallWriter, MemoryCallSink

__all__ = ["CallSink", "DbCallWriter", "MemoryCallSink", "create_proxy_app"]

_HOMES = {
    "create_proxy_app": "polar_mq.proxy.server.app",
    "CallSink": "polar_mq.proxy.store.writer",
    "DbCallWriter": "polar_mq.proxy.store.writer",
    "MemoryCallSink": "polar_mq.proxy.store.writer",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
