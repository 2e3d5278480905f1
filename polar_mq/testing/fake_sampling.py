"""Deterministic "sampling" for the fake engine: token ids, finish reasons and logprobs.

Logprobs are multiples of 1/1024, exactly representable in float32, so a capture stored packed
(float32) in the database compares equal to what the fake returned. The sampled token is always the
most likely one (greedy), as with real vLLM at temperature 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar_mq.testing.fake_policy import Reply, ToolCall
from polar_mq.testing.fake_tokenizer import (
    BYTE_OFFSET,
    IM_END,
    VOCAB_SIZE,
    StreamDecoder,
    encode,
    token_bytes,
    token_str,
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One generated choice: ids (ending in `<|im_end|>` on a natural stop) and why it ended."""

    token_ids: list[int]
    finish_reason: str
    tool_call: ToolCall | None
    text: str


def sample(reply: Reply, max_tokens: int | None) -> Sample:
    """Generate `reply` then `<|im_end|>`, truncated to `max_tokens` (finish_reason "length")."""
    ids = [*encode(reply.text), IM_END]
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        decoder = StreamDecoder()
        return Sample(ids, "length", None, "".join(decoder.step(t) for t in ids))
    finish = "tool_calls" if reply.tool_call else "stop"
    return Sample(ids, finish, reply.tool_call, reply.text)


def token_logprob(token_id: int, position: int) -> float:
    return -float((token_id * 31 + position * 17) % 64 + 1) / 1024.0


def top_candidates(token_id: int, position: int, k: int) -> list[tuple[int, float]]:
    """The `k` most likely tokens at `position`, the sampled one first (greedy)."""
    best = token_logprob(token_id, position)
    out = [(token_id, best)][:k]
    step = 1
    while len(out) < k:
        alt = BYTE_OFFSET + (token_id + step * 37) % (VOCAB_SIZE - BYTE_OFFSET)
        if alt != token_id:
            out.append((alt, best - 1.25 * len(out)))
        step += 1
    return out


def chat_logprob_entry(token_id: int, position: int, top_k: int) -> dict[str, Any]:
    """One `choices[i].logprobs.content[]` element, shaped like vLLM's."""
    return {
        "token": token_str(token_id),
        "logprob": token_logprob(token_id, position),
        "bytes": list(token_bytes(token_id)),
        "top_logprobs": [
            {"token": token_str(t), "logprob": lp, "bytes": list(token_bytes(t))}
            for t, lp in top_candidates(token_id, position, top_k)
        ],
    }


def completion_logprobs(ids: list[int], start: int, n: int, text_offset: int) -> dict[str, Any]:
    """The completions-API logprobs object for `ids` generated from `start` on."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top: list[dict[str, float]] = []
    offsets: list[int] = []
    decoder = StreamDecoder()
    for i, token_id in enumerate(ids, start):
        offsets.append(text_offset)
        text_offset += len(decoder.step(token_id))
        tokens.append(token_str(token_id))
        token_logprobs.append(token_logprob(token_id, i))
        top.append({token_str(t): lp for t, lp in top_candidates(token_id, i, max(n, 1))})
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top,
    }
