"""Over real sockets: the fake engine as a process (its CLI), the proxy under its own server, the
SDK.

This is how an agent sees the proxy: HTTP framing, real streaming and real disconnects.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.fake_vllm import FakeStats, create_fake_vllm_app
from polar_mq.testing.servers import free_port, serve_in_thread

if TYPE_CHECKING:  # the SDK loads only where a test uses it: every xdist worker collects this file
    import openai

CALCULATOR: Any = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def fake_process() -> Iterator[str]:
    """`python -m polar_mq.testing.fake_vllm` on a free port."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "polar_mq.testing.fake_vllm",
        "--port",
        str(port),
        "--ttft-ms",
        "2",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            return httpx.get(f"{url}/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 20)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


@pytest.fixture
def proxy(fake_process: str) -> Iterator[tuple[str, MemoryCallSink]]:
    sink = MemoryCallSink()
    app = create_proxy_app(proxy_settings(upstream_url=fake_process), sink=sink)
    with serve_in_thread(app, server="lean") as url:
        yield url, sink


def sdk(base_url: str, api_key: str) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)


def test_calculator_agent_with_native_tools(proxy: tuple[str, MemoryCallSink]) -> None:
    url, sink = proxy
    rollout = uuid.uuid4()
    client = sdk(f"{url}/v1", issue_rollout_token(SECRET, rollout, 600))
    messages: list[Any] = [{"role": "user", "content": "What is 17 + 25?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and first.model == "policy"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "17 + 25"}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    second = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
    assert second.choices[0].message.content == "ANSWER: 42"
    wait_until(lambda: len(sink.rows) == 2)
    turn1, turn2 = sink.rows
    assert [turn1["seq"], turn2["seq"]] == [0, 1]
    assert turn1["rollout_id"] == turn2["rollout_id"] == rollout
    # Token-level continuity: turn 1's prompt + completion is a prefix of turn 2's prompt.
    history = turn1["prompt_ids"] + turn1["completion_ids"]
    assert turn2["prompt_ids"][: len(history)] == history
    assert turn1["completion_ids"][-1] == 2


def test_text_protocol_streaming_and_completions(proxy: tuple[str, MemoryCallSink]) -> None:
    url, sink = proxy
    token = issue_rollout_token(SECRET, uuid.uuid4(), 600)
    client = sdk(f"{url}/r/{token}/v1", "placeholder-key")  # token in the base URL only
    messages: list[Any] = [{"role": "user", "content": "Please compute (3 + 4) * 5."}]
    stream = client.chat.completions.create(model="policy", messages=messages, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "CALC: (3 + 4) * 5"
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "RESULT: 35"}]
    answer = client.chat.completions.create(model="policy", messages=messages)
    assert answer.choices[0].message.content == "ANSWER: 35"
    completion = client.completions.create(model="policy", prompt="Count: 1 2 3", max_tokens=6)
    assert completion.choices[0].finish_reason == "length"
    wait_until(lambda: len(sink.rows) == 3)
    streamed, answered, completed = sink.rows
    assert (streamed["stream"], streamed["complete"], streamed["finish_reason"]) == (
        True,
        True,
        "stop",
    )
    assert streamed["ttft_ms"] is not None
    history = streamed["prompt_ids"] + streamed["completion_ids"]
    assert answered["prompt_ids"][: len(history)] == history
    assert completed["api_type"] == "completions" and len(completed["completion_ids"]) == 6
    assert len(completed["logprobs"]) == 6


def test_sdk_sees_openai_errors(proxy: tuple[str, MemoryCallSink]) -> None:
    import openai

    url, sink = proxy
    client = sdk(f"{url}/v1", "pmq_not_a_real_token")
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert sink.rows == []


def test_disconnect_over_sockets_aborts_upstream_and_logs_partial_call() -> None:
    fake = create_fake_vllm_app(token_delay_s=0.02)
    stats: FakeStats = fake.state.stats
    sink = MemoryCallSink()
    with serve_in_thread(fake) as upstream_url:
        app = create_proxy_app(proxy_settings(upstream_url=upstream_url), sink=sink)
        with serve_in_thread(app, server="lean") as url:
            token = issue_rollout_token(SECRET, uuid.uuid4(), 600)
            body = {
                "model": "m",
                "stream": True,
                "messages": [{"role": "user", "content": "What is 123 + 456?"}],
            }
            with httpx.Client(timeout=10) as client:
                with client.stream(
                    "POST", f"{url}/v1/chat/completions", json=body, headers={"x-api-key": token}
                ) as response:
                    lines = response.iter_lines()
                    received = [next(lines) for _ in range(5)]  # role chunk + 2 tokens
                assert received[0].startswith("data: ")
            wait_until(lambda: len(sink.rows) == 1)
            wait_until(lambda: stats.streams_aborted == 1)
            time.sleep(0.1)
            assert len(sink.rows) == 1
    (row,) = sink.rows
    assert (row["complete"], row["status_code"], row["stream"]) == (False, 499, True)
    assert 0 < len(row["completion_ids"]) < len("CALC: 123 + 456") + 1
    assert stats.streams_finished == 0
