"""Token-in/token-out on the chat route, against the fake vLLM (its byte tokenizer is exact).

Golden: every TITO prompt equals the ids the engine's chat path gives the same messages, and the
agent gets the same answer (content, tool calls, finish reason) it would get on the chat path,
streamed or not. A rewritten history falls back with the reason recorded; a reasoning model's
template that drops earlier thinking breaks the prefix every turn on the chat path and never
under TITO.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
import redis
from proxy_support import Harness, proxy_settings, start_harness
from tito_support import ask, captured, chat_prompt, run_agent

from polar_mq.testing.fake_vllm import create_fake_vllm_app
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder

pytestmark = pytest.mark.anyio

REDIS_URL = "redis://127.0.0.1:6379/7"
"""A database of its own: the test deletes the turns it left."""


def shape(got: dict[str, Any]) -> dict[str, Any]:
    """What an agent reads of an answer (tool call ids are random on both paths)."""
    message = got["message"]
    calls = [
        (c["type"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or ()
    ]
    return {"content": message.get("content"), "calls": calls, "finish": got["finish_reason"]}


@pytest.mark.parametrize("stream", [False, True])
async def test_tito_prompts_and_answers_equal_the_chat_paths(stream: bool) -> None:
    async for h in start_harness(proxy_settings(proxy_tito="on")):
        turns = await run_agent(h, stream=stream)
        rows = await h.rows()
        assert len(rows) == len(turns) == 6
        assert h.stats.paths["/v1/completions"] == 5
        assert (
            h.stats.last_request is not None
            and h.stats.last_request["prompt"] == (rows[-1]["prompt_ids"])
        )
        assert [r["prompt_source"] for r in rows] == ["chat"] + ["tito"] * 5
        assert rows[0]["tito_fallback"] == "first_call"
        assert all(r["tito_fallback"] is None for r in rows[1:])
        for before, row in itertools.pairwise(rows):  # each extends its predecessor
            context = before["prompt_ids"] + before["completion_ids"]
            assert row["prompt_ids"][: len(context)] == context
        for turn, row in zip(turns, rows, strict=True):
            assert row["prompt_ids"] == chat_prompt(turn["body"])  # what chat would have sent
            calls = turn["message"].get("tool_calls") or []
            if stream:  # stored in chat's form, with the tool call ids the agent was sent
                assert row["response"]["text"] == (turn["message"]["content"] or "")
                assert [c["id"] for c in row["response"].get("tool_calls", [])] == [
                    c["id"] for c in calls
                ]
            else:
                stored = row["response"]
                assert stored["object"] == "chat.completion"
                assert stored["prompt_token_ids"] == row["prompt_ids"]
                assert stored["choices"][0]["token_ids"] == row["completion_ids"]
                message = stored["choices"][0]["message"]
                assert message["content"] == turn["message"]["content"]
                assert message.get("tool_calls", []) == calls
            assert row["complete"] and row["status_code"] == 200
            direct = await h.direct(
                "/v1/chat/completions", {**turn["body"], "stream": False, "model": "fake-model"}
            )
            choice = direct["choices"][0]
            assert shape(turn) == shape(
                {"message": choice["message"], "finish_reason": choice["finish_reason"]}
            )
        result = PrefixMergeBuilder().build(captured(rows))
        assert result.stats["samples"] == 1 and result.stats["tito_proven"] == 5


async def test_tito_off_sends_every_call_the_chat_way() -> None:
    async for h in start_harness(proxy_settings()):
        await run_agent(h)
        rows = await h.rows()
        assert {(r["prompt_source"], r["tito_fallback"]) for r in rows} == {("chat", None)}
        assert h.stats.paths["/v1/completions"] == 0


async def test_a_compacted_history_falls_back_and_records_why() -> None:
    async for h in start_harness(proxy_settings(proxy_tito="on")):
        turns = await run_agent(h, questions=("What is (3+4)*5?",))
        compacted = [
            {"role": "system", "content": "You compute."},
            {"role": "user", "content": "Summary: (3+4)*5 is 35."},
            {"role": "user", "content": "What is 6*7?"},
        ]
        got = await ask(
            h, {"model": "agent", "messages": compacted, "tools": turns[0]["body"]["tools"]}
        )
        assert got["message"]["tool_calls"][0]["function"]["name"] == "calculator"
        # and the turn after the compaction extends it again
        history = [
            *compacted,
            got["message"],
            {"role": "tool", "tool_call_id": "x", "content": "42"},
        ]
        history[-1]["tool_call_id"] = got["message"]["tool_calls"][0]["id"]
        await ask(h, {"model": "agent", "messages": history, "tools": turns[0]["body"]["tools"]})
        rows = await h.rows()
        sources = [(r["prompt_source"], r["tito_fallback"]) for r in rows]
        assert sources == [
            ("chat", "first_call"),
            ("tito", None),
            ("chat", "history_rewritten"),
            ("tito", None),
        ]
        result = PrefixMergeBuilder().build(captured(rows))
        assert result.stats["samples"] == 2
        assert result.stats["tito_fallbacks"] == 1 and result.stats["tito_proven"] == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: m[:-3] + m[-2:], "history_rewritten"),  # a turn dropped
        (lambda m: [*m[:-2], {**m[-2], "content": "edited"}, m[-1]], "reply_edited"),
        (lambda m: [*m[:-2], m[-1], m[-1]], "reply_dropped"),  # as mini-swe-agent does
    ],
)
async def test_edits_are_fallbacks(change: Any, reason: str) -> None:
    async for h in start_harness(proxy_settings(proxy_tito="on")):
        body: dict[str, Any] = {"model": "agent", "messages": [{"role": "user", "content": "2+3?"}]}
        first = await ask(h, body)
        messages = [*body["messages"], first["message"], {"role": "user", "content": "RESULT: 5"}]
        await ask(h, {"model": "agent", "messages": change(messages)})
        rows = await h.rows()
        assert rows[-1]["prompt_source"] == "chat" and rows[-1]["tito_fallback"] == reason


async def test_options_only_chat_honours_go_the_chat_way() -> None:
    async for h in start_harness(proxy_settings(proxy_tito="on")):
        body: dict[str, Any] = {"model": "agent", "messages": [{"role": "user", "content": "2+3?"}]}
        first = await ask(h, body)
        messages = [*body["messages"], first["message"], {"role": "user", "content": "RESULT: 5"}]
        await ask(h, {"model": "agent", "messages": messages, "response_format": {"type": "text"}})
        rows = await h.rows()
        assert rows[-1]["tito_fallback"] == "response_format"


@pytest.mark.parametrize("tito", ["on", "off"])
async def test_reasoning_template_merges_only_under_tito(tito: str) -> None:
    """The model thinks before every reply and its template drops earlier thinking: on the chat
    path no turn extends the last; under TITO every one does."""
    fake = create_fake_vllm_app(thinking=True)
    async for h in start_harness(proxy_settings(proxy_tito=tito), fake):
        turns = await run_agent(h, tools=False)
        assert turns[0]["message"]["content"].startswith("<think>")
        rows = await h.rows()
        boundaries = len(rows) - 1
        held = sum(
            row["prompt_ids"][: len(b["prompt_ids"]) + len(b["completion_ids"])]
            == b["prompt_ids"] + b["completion_ids"]
            for b, row in itertools.pairwise(rows)
        )
        result = PrefixMergeBuilder().build(captured(rows))
        if tito == "on":
            assert held == boundaries and result.stats["samples"] == 1
            assert result.stats["merged"] == boundaries
        else:
            assert held == 0 and result.stats["samples"] == len(rows)
            assert result.stats["broken"] == boundaries


async def test_a_turn_is_found_by_another_proxy_process() -> None:
    """Two proxy processes sharing Redis (as `--workers 2` does): the agent's calls alternate
    between them and every turn after the first still goes token-in."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    finally:
        client.close()
    settings = proxy_settings(proxy_tito="on", proxy_shared_seq=True, proxy_redis_url=REDIS_URL)
    fake = create_fake_vllm_app()
    rollout = uuid.uuid4()
    async for a in start_harness(settings, fake):
        async for b in start_harness(settings, fake):
            a.rollout_id = b.rollout_id = rollout
            alternating = Alternating(a, b)
            await run_agent(alternating)  # type: ignore[arg-type]
            rows = sorted([*(await a.rows()), *(await b.rows())], key=lambda r: r["seq"])
            assert [r["prompt_source"] for r in rows] == ["chat"] + ["tito"] * 5
            assert {r["seq"] % 2 for r in await a.rows()} == {0}
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = client.keys(f"polar:tito:{rollout}:*")
        assert keys == [f"polar:tito:{rollout}:1".encode()]
        client.delete(*keys)
        client.delete(*client.keys(f"*{rollout}*") or ["-"])  # the shared call counter's too
    finally:
        client.close()


class Alternating:
    """A harness stand-in whose calls go to two proxies in turn."""

    def __init__(self, a: Harness, b: Harness) -> None:
        self._hs = (a, b)
        self._n = 0

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        h = self._hs[self._n % 2]
        self._n += 1
        return await h.post(path, body)
