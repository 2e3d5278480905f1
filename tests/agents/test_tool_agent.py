"""The reference agent as a real subprocess against an in-test OpenAI-compatible stub server."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from polar_mq.agents.calculator import calculate, format_number, parse_directive, run_calculator
from polar_mq.harnesses import AgentContext, get_harness
from polar_mq.runtimes import LocalRuntime
from tests.conftest import runtime_id

Reply = Callable[[dict[str, Any]], dict[str, Any]]  # request body -> assistant message
MODEL = "stub-model"


@dataclass
class Stub:
    """A vLLM-shaped chat endpoint that answers from a script and records what it was sent."""

    reply: Reply
    status: int = 200
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    base_url: str = ""

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        message = self.reply(body)
        ids = [100 + len(self.requests), 2]
        self.token_ids.append(ids)
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                    "token_ids": ids,
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }


def make_handler(stub: Stub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            models = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0}]}
            self._send(200, models if self.path == "/v1/models" else {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stub.requests.append(body)
            stub.auth.append(self.headers.get("Authorization"))
            if stub.status != 200:
                self._send(stub.status, {"error": {"message": "upstream exploded"}})
            else:
                self._send(200, stub.completion(body))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def serve() -> Iterator[Callable[[Stub], Stub]]:
    servers: list[ThreadingHTTPServer] = []

    def start(stub: Stub) -> Stub:
        server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(stub))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        stub.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        return stub

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def calc_then_answer(body: dict[str, Any]) -> dict[str, Any]:
    if body["messages"][-1] == {"role": "user", "content": "RESULT: 42"}:
        return {"role": "assistant", "content": "ANSWER: 42"}
    return {"role": "assistant", "content": "CALC: 6*7"}


def tool_call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def native_calc_then_submit(body: dict[str, Any]) -> dict[str, Any]:
    last = body["messages"][-1]
    if last.get("role") == "tool" and last.get("content") == "42":
        return tool_call("call-2", "submit_answer", {"answer": "42"})
    return tool_call("call-1", "calculator", {"expression": "6*7"})


def run_agent(stub: Stub, workdir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "OPENAI_BASE_URL": stub.base_url,
        "OPENAI_API_KEY": "tok-rollout",
        "POLAR_INSTRUCTION": "What is 6 times 7?",
        "POLAR_WORKDIR": str(workdir),
        "POLAR_MODEL": MODEL,
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "polar_mq.agents.tool_agent"],
        env={k: v for k, v in env.items() if v},
        cwd=workdir.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def read_transcript(workdir: Path) -> list[dict[str, Any]]:
    lines = (workdir / "transcript.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_history_appended(requests: list[dict[str, Any]]) -> None:
    for earlier, later in itertools.pairwise(requests):
        assert later["messages"][: len(earlier["messages"])] == earlier["messages"]


def test_text_mode_calc_then_answer(serve: Callable[[Stub], Stub], tmp_path: Path) -> None:
    stub = serve(Stub(calc_then_answer))
    workdir = tmp_path / "work"
    done = run_agent(stub, workdir, POLAR_AGENT_REQUEST_TOKEN_IDS="1")
    assert done.returncode == 0, done.stderr

    assert (workdir / "answer.txt").read_text() == "42"
    assert len(stub.requests) == 2 and stub.auth == ["Bearer tok-rollout"] * 2
    first, second = stub.requests
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert "CALC:" in first["messages"][0]["content"]
    assert second["messages"] == [
        *first["messages"],
        {"role": "assistant", "content": "CALC: 6*7"},
        {"role": "user", "content": "RESULT: 42"},
    ]
    for body in stub.requests:
        assert body["model"] == MODEL and "tools" not in body
        assert body["temperature"] == 1.0 and body["max_tokens"] == 128
        assert body["return_token_ids"] is True and body["logprobs"] is True

    transcript = read_transcript(workdir)
    assert [t["messages"] for t in transcript] == [r["messages"] for r in stub.requests]
    assert [t["response"]["choices"][0]["token_ids"] for t in transcript] == stub.token_ids
    assert transcript[1]["response"]["choices"][0]["message"]["content"] == "ANSWER: 42"
    assert transcript[0]["response"]["prompt_token_ids"] == [1, 2, 3]


def test_native_mode_tool_calls(serve: Callable[[Stub], Stub], tmp_path: Path) -> None:
    stub = serve(Stub(native_calc_then_submit))
    workdir = tmp_path / "work"
    done = run_agent(stub, workdir, POLAR_AGENT_TOOLS="native")
    assert done.returncode == 0, done.stderr

    assert (workdir / "answer.txt").read_text() == "42"
    assert len(stub.requests) == 2
    first, second = stub.requests
    assert {t["function"]["name"] for t in first["tools"]} == {"calculator", "submit_answer"}
    assert "return_token_ids" not in first and "logprobs" not in first
    assert second["messages"] == [
        *first["messages"],
        tool_call("call-1", "calculator", {"expression": "6*7"}),
        {"role": "tool", "tool_call_id": "call-1", "content": "42"},
    ]
    assert len(read_transcript(workdir)) == 2


def test_nudges_then_stops_at_max_turns(serve: Callable[[Stub], Stub], tmp_path: Path) -> None:
    stub = serve(Stub(lambda body: {"role": "assistant", "content": "Hmm, let me think."}))
    workdir = tmp_path / "work"
    done = run_agent(stub, workdir, POLAR_AGENT_MAX_TURNS="3", POLAR_AGENT_TEMPERATURE="0.3")
    assert done.returncode == 0, done.stderr

    assert len(stub.requests) == 3
    assert_history_appended(stub.requests)
    assert stub.requests[1]["messages"][-2:] == [
        {"role": "assistant", "content": "Hmm, let me think."},
        {"role": "user", "content": stub.requests[1]["messages"][-1]["content"]},
    ]
    assert "ANSWER:" in stub.requests[1]["messages"][-1]["content"]  # the nudge
    assert {body["temperature"] for body in stub.requests} == {0.3}
    assert (workdir / "answer.txt").read_text() == "Hmm, let me think."


def test_model_from_models_list(serve: Callable[[Stub], Stub], tmp_path: Path) -> None:
    stub = serve(Stub(lambda body: {"role": "assistant", "content": "ANSWER: 42"}))
    done = run_agent(stub, tmp_path / "work", POLAR_MODEL="")
    assert done.returncode == 0, done.stderr
    assert [body["model"] for body in stub.requests] == [MODEL]


def test_api_error_exits_1(serve: Callable[[Stub], Stub], tmp_path: Path) -> None:
    stub = serve(Stub(calc_then_answer, status=500))
    workdir = tmp_path / "work"
    done = run_agent(stub, workdir, POLAR_AGENT_MAX_RETRIES="0")
    assert done.returncode == 1
    assert "upstream exploded" in done.stderr
    assert not (workdir / "answer.txt").exists()


def test_reference_harness_in_local_runtime(serve: Callable[[Stub], Stub], tmp_path: Path) -> None:
    """The path the run-agent stage takes: harness spec -> command + env -> runtime exec."""
    stub = serve(Stub(calc_then_answer))
    runtime = LocalRuntime(runtime_id("agent-rt"), tmp_path / "runtimes")
    runtime.start()
    try:
        harness = get_harness({"type": "reference", "env": {"POLAR_AGENT_MAX_TURNS": "5"}})
        ctx = AgentContext(
            rollout_id="r-1",
            instruction="What is 6 times 7?",
            task_file=str(runtime.workdir / "task.json"),
            workdir=str(runtime.workdir),
            proxy_base_url=stub.base_url,
            api_key="tok-rollout",
            model=MODEL,
        )
        result = runtime.exec(harness.command(ctx), env=harness.env(ctx), timeout=120)
        assert result.ok, result.stderr_tail
        assert runtime.download("answer.txt") == b"42"
        assert len(stub.requests) == 2
    finally:
        runtime.stop()


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("6*7", "42"), ("2^10", "1024"), ("7/2", "3.5"), ("6/3", "2"), ("-(3 + 4) % 5", "3")],
)
def test_calculator(expression: str, expected: str) -> None:
    assert run_calculator(expression) == expected
    assert format_number(calculate(f"`{expression} =`")) == expected


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "x + 1", "9**9**9", "(10**1000)**1000", "'a' * 3", "1/0"]
)
def test_calculator_refuses(expression: str) -> None:
    assert run_calculator(expression).startswith("error:")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("CALC: 6*7", ("CALC", "6*7")),
        ("First CALC: 2+2 then ANSWER: 4", ("CALC", "2+2 then ANSWER: 4")),
        ("so the answer:\n 42 ", ("ANSWER", "42")),
        ("ANSWER:", None),
        ("RECALC: 3", None),
        (None, None),
    ],
)
def test_parse_directive(content: str | None, expected: tuple[str, str] | None) -> None:
    assert parse_directive(content) == expected
