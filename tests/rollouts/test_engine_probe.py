"""An engine that is down is not blamed on the harness: `engines_down` asks the proxy whether it
has a usable engine, and `classify` calls a failed run without stored calls a backend error when
it has none."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from polar_mq.infra.ports import free_port
from polar_mq.rollouts.agent_outcome import CallSummary, classify
from polar_mq.rollouts.engine_probe import engines_down
from polar_mq.runtimes import ExecResult

STARTED = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _proxy_answering(body: bytes) -> type[BaseHTTPRequestHandler]:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Health


@contextmanager
def proxy(body: bytes) -> Iterator[str]:
    """A stand-in proxy whose /healthz answers `body`."""
    server = HTTPServer(("127.0.0.1", 0), _proxy_answering(body))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_proxy_with_a_usable_engine_says_the_engine_is_up() -> None:
    with proxy(b'{"status": "ok", "backends": 2, "backends_usable": 1}') as url:
        assert engines_down(url) is None


def test_a_proxy_without_a_usable_engine_names_itself_and_the_counts() -> None:
    with proxy(b'{"status": "ok", "backends": 2, "backends_usable": 0}') as url:
        why = engines_down(url)
    assert why == (
        f"no engine answers the proxy at {url} (0 of 2 engines usable): the agent's LLM calls "
        "could not be served; start the engine or fix the proxy's POLAR_MQ_UPSTREAM_URL(S)"
    )


@pytest.mark.parametrize("body", [b'{"status": "ok"}', b"not json", b'{"backends_usable": "0"}'])
def test_a_proxy_that_cannot_say_leaves_the_verdict_to_the_calls(body: bytes) -> None:
    with proxy(body) as url:
        assert engines_down(url) is None
    assert engines_down(f"http://127.0.0.1:{free_port()}") is None  # no proxy there at all


def test_a_failed_run_without_calls_is_the_engines_fault_when_it_is_down() -> None:
    failed = ExecResult(1, "", "", False, False, 1.0)
    no_calls = CallSummary(0, None)
    down = classify(failed, no_calls, STARTED, None, engine_down=lambda: "the engine is down")
    assert (down.reason, down.why, down.restart) == ("backend_error", "the engine is down", True)
    up = classify(failed, no_calls, STARTED, None, engine_down=lambda: None)
    assert up.reason == "runtime_error"
    assert up.why == "the harness ended before any LLM call reached the proxy"


def test_the_engine_is_asked_only_for_a_failed_run_without_calls() -> None:
    def never() -> str | None:
        raise AssertionError("asked")

    ok = ExecResult(0, "", "", False, False, 1.0)
    assert classify(ok, CallSummary(0, None), STARTED, None, engine_down=never).reason == (
        "completed"
    )
    failed = ExecResult(1, "", "", False, False, 1.0)
    assert classify(failed, CallSummary(2, 200), STARTED, None, engine_down=never).reason == (
        "agent_error"
    )


def test_a_502_is_the_engines_fault_when_it_is_down() -> None:
    failed = ExecResult(1, "", "", False, False, 1.0)
    proxy_502 = CallSummary(2, 502)
    down = classify(failed, proxy_502, STARTED, None, engine_down=lambda: "the engine is down")
    assert (down.reason, down.why, down.restart) == ("backend_error", "the engine is down", True)
    up = classify(failed, proxy_502, STARTED, None, engine_down=lambda: None)
    assert up.why == "the agent's last LLM call failed on the platform's side (HTTP 502)"
