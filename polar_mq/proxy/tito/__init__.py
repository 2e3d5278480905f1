"""Token-in/token-out (TITO): the engine sees exactly the tokens it sampled on earlier turns.

On the chat path the engine re-renders and re-tokenizes an agent's whole history every turn, and
the ids it conditions on at turn k+1 are not always the ids it sampled at turn k (a reasoning
template drops earlier thinking, a tool call's JSON is re-serialized, text re-tokenizes
differently), which splits `prefix_merge` samples. Under TITO a turn whose messages are the
previous turn's messages + the reply the agent got + new messages is sent to `/v1/completions`
as a token prompt: previous prompt ids + completion ids + the template's close of that turn + the
new messages rendered by the model's own chat template (`delta`). Anything else (first call,
rewritten history, options a token prompt cannot honour) goes the chat way with the reason
recorded (`llm_calls.prompt_source`, `tito_fallback`).

Modules: `history` (does this turn extend the last one?), `store` (the last turn's ids, in this
process or in Redis for a multi-process proxy), `delta` (the new messages' ids, from the engine's
`/tokenize`), `request` (the completions body), `tool_parsers` and `answer` (the completion back
into a chat answer, streamed or not), `route` (the hook on the chat route).
"""

from __future__ import annotations

from polar_mq.proxy.tito.route import Tito, tito_enabled

__all__ = ["Tito", "tito_enabled"]
