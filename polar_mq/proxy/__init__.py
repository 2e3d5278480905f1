"""The token-capturing, OpenAI-compatible proxy in front of the inference engines.

Hot path: `app` (routes) -> `auth` -> `body` -> `engines.<engine>` (rewrite, extract, strip) ->
`backends` (pick a backend, retry before the first byte) -> `capture` (forward, stream relay) ->
`writer` (enqueue only; a thread writes batches to the database, spilling to disk when it is down).
"""

from polar_mq.proxy.app import create_proxy_app
from polar_mq.proxy.writer import CallSink, DbCallWriter, MemoryCallSink

__all__ = ["CallSink", "DbCallWriter", "MemoryCallSink", "create_proxy_app"]
