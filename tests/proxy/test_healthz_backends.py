"""The proxy's `/healthz` says how many of its engines it can use (never their addresses): the
run-agent stage asks it whether a failed run without calls met an engine that is down."""

from __future__ import annotations

import time

import httpx
from proxy_support import proxy_settings

from polar_mq.infra.ports import free_port
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.rollouts.engine_probe import engines_down
from polar_mq.testing.fake_vllm import create_fake_vllm_app
from polar_mq.testing.servers import serve_in_thread

FAST_HEALTH = {"health_interval_s": 0.1, "health_timeout_s": 0.5, "breaker_failures": 2}


def health(url: str) -> dict[str, object]:
    answer = httpx.get(url + "/healthz", timeout=5)
    assert answer.status_code == 200, answer.text
    body: dict[str, object] = answer.json()
    return body


def test_a_proxy_whose_engine_answers_counts_it_usable() -> None:
    with serve_in_thread(create_fake_vllm_app()) as engine:
        settings = proxy_settings(upstream_url=engine, **FAST_HEALTH)
        with serve_in_thread(
            create_proxy_app(settings, sink=MemoryCallSink()), server="lean"
        ) as proxy:
            body = health(proxy)
            assert (body["backends"], body["backends_usable"]) == (1, 1)
            assert engine.split("//")[1] not in str(body)  # the engine's address stays private
            assert engines_down(proxy) is None


def test_a_proxy_whose_engine_is_down_counts_none_usable() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    settings = proxy_settings(upstream_url=closed, **FAST_HEALTH)
    with serve_in_thread(create_proxy_app(settings, sink=MemoryCallSink()), server="lean") as proxy:
        deadline = time.monotonic() + 20
        while health(proxy)["backends_usable"] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert health(proxy)["backends_usable"] == 0
        why = engines_down(proxy)
    assert why is not None and why.startswith(f"no engine answers the proxy at {proxy} (0 of 1")
