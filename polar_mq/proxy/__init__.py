"""The token-capturing, OpenAI-compatible proxy in front of the inference engines.

Hot path: `app` (routes) -> `auth` -> `body` -> `engines.vllm` (rewrite, extract, strip) ->
`capture` (forward, stream relay) -> `writer` (enqueue only; a thread writes to the database).
"""

from polar_mq.proxy.app import create_proxy_app
from polar_mq.proxy.writer import CallSink, DbCallWriter, MemoryCallSink

__all__ = ["CallSink", "DbCallWriter", "MemoryCallSink", "create_proxy_app"]
