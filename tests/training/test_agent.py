"""The trainer's agent sends a seeded job's per-rollout seed with its one chat call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest


@pytest.fixture()
def openai_stub() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A chat endpoint that records the bodies it gets and answers "Paris"."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            answer = json.dumps({"choices": [{"message": {"content": "Paris"}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", bodies
    finally:
        server.shutdown()
        server.server_close()


def run_agent(base_url: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "polar_mq.training.agent"],
        env={**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "k",
             "POLAR_INSTRUCTION": "Capital of France?", "POLAR_MODEL": "m", **env},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def test_the_rollout_seed_goes_out_with_the_call(
    openai_stub: tuple[str, list[dict[str, Any]]],
) -> None:
    base_url, bodies = openai_stub
    assert run_agent(base_url, POLAR_AGENT_SEED="123456").strip() == "Paris"
    assert bodies[-1]["seed"] == 123456
    assert bodies[-1]["messages"] == [{"role": "user", "content": "Capital of France?"}]


def test_no_seed_unless_the_job_is_seeded(openai_stub: tuple[str, list[dict[str, Any]]]) -> None:
    base_url, bodies = openai_stub
    run_agent(base_url, POLAR_AGENT_SEED="")
    assert "seed" not in bodies[-1]
