"""Small pieces of the hot path: SSE re-framing, request rewrite, logprob alignment, seq counter."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from polar_mq.proxy.engines import check_engine
from polar_mq.proxy.engines.vllm import CHAT, COMPLETIONS, extract_response, rewrite_request
from polar_mq.proxy.sse import SseRelay
from polar_mq.proxy.store.seq import LocalSeq


def relay_all(*pieces: bytes) -> tuple[bytes, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    relay = SseRelay(seen.append)
    out = b"".join(relay.feed(p) for p in pieces) + relay.flush()
    return out, seen


def test_sse_passes_non_json_and_comments_through() -> None:
    out, seen = relay_all(b": ping\n\ndata: not json\n\nevent: x\ndata: {}\n\ndata: [DONE]\n\n")
    assert out == b": ping\n\ndata: not json\n\nevent: x\ndata: {}\n\ndata: [DONE]\n\n"
    assert seen == []


def test_sse_crlf_and_missing_final_blank_line() -> None:
    out, seen = relay_all(b'data: {"a": 1}\r\n\r\ndata: {"b"', b": 2}")
    assert seen == [{"a": 1}, {"b": 2}]
    assert out == b'data: {"a":1}\n\ndata: {"b":2}\n\n'


def test_sse_event_is_released_only_when_complete() -> None:
    relay = SseRelay(lambda chunk: None)
    assert relay.feed(b'data: {"a": ') == b""
    assert relay.feed(b"1}\n") == b""
    assert relay.feed(b"\n") == b'data: {"a":1}\n\n'
    assert not relay.done


@pytest.mark.parametrize(
    ("api_type", "asked", "sent"),
    [
        (CHAT, {}, True),
        (CHAT, {"logprobs": False, "top_logprobs": 3}, True),
        (COMPLETIONS, {}, 0),
        (COMPLETIONS, {"logprobs": 3}, 3),
        (COMPLETIONS, {"logprobs": -1}, 0),
    ],
)
def test_rewrite_asks_for_ids_and_logprobs(api_type: str, asked: dict[str, Any], sent: Any) -> None:
    body = {"model": "agent-model", **asked}
    upstream, view = rewrite_request(api_type, body, "served")
    assert upstream["logprobs"] == sent and upstream["return_token_ids"] is True
    assert upstream["model"] == "served" and body == {"model": "agent-model", **asked}
    assert upstream.get("top_logprobs") == asked.get("top_logprobs")
    assert view.agent_model == "agent-model" and not view.token_ids


def test_rewrite_keeps_model_without_served_model() -> None:
    upstream, _ = rewrite_request(CHAT, {"model": "m"}, None)
    assert upstream["model"] == "m"


def test_echoed_prompt_logprobs_are_dropped() -> None:
    data = {
        "choices": [
            {
                "index": 0,
                "token_ids": [7, 8],
                "prompt_token_ids": [1, 2, 3],
                "logprobs": {"token_logprobs": [None, -1.0, -2.0, -0.5, -0.25]},
                "finish_reason": "length",
            }
        ]
    }
    capture = extract_response(COMPLETIONS, data)
    assert capture.logprobs == [-0.5, -0.25]
    data["choices"][0]["logprobs"] = {"token_logprobs": [-0.5]}  # too few: unusable
    assert extract_response(COMPLETIONS, data).logprobs is None


def test_response_without_token_ids() -> None:
    capture = extract_response(CHAT, orjson.loads(b'{"choices": [{"index": 0, "logprobs": null}]}'))
    assert capture.completion_ids is None and capture.logprobs is None


def test_seq_counter_is_bounded() -> None:
    seqs = LocalSeq(max_rollouts=2)
    a, b, c = ((uuid.uuid4(), 1) for _ in range(3))
    assert [seqs.take(a), seqs.take(a), seqs.take(b), seqs.take(a)] == [0, 1, 0, 2]
    seqs.take(c)  # evicts b, the least recently used
    assert seqs.take(a) == 3 and seqs.take(b) == 0


def test_unknown_engine_is_refused_at_boot() -> None:
    for name in ("vllm", "sglang", "generic"):
        check_engine(name)
    with pytest.raises(ValueError, match="not supported"):
        check_engine("tgi")
