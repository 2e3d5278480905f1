"""Several fake engines on real sockets behind one proxy (also on a real socket), for the
multi-backend, failover and pause tests; call rows go to a `MemoryCallSink`."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from proxy_support import FRESH_HTTP, SECRET, proxy_settings
from starlette.applications import Starlette

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.tls import client_ssl_context
from polar_mq.proxy import CallSink, MemoryCallSink, create_proxy_app
from polar_mq.proxy.backends.rendezvous import order_of
from polar_mq.testing.fake_vllm import FakeStats, create_fake_vllm_app
from polar_mq.testing.servers import free_port, serve_in_thread

ADMIN_TOKEN = "admin-secret"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = "/v1/chat/completions"
QUESTION = [{"role": "user", "content": "What is 123 + 456?"}]


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def rollout_preferring(order: Sequence[str], backends: Iterable[str]) -> uuid.UUID:
    """A new rollout id whose rendezvous order over `backends` (weight 1) starts with `order`."""
    weights = dict.fromkeys(backends, 1.0)
    while True:
        rollout = uuid.uuid4()
        if order_of(rollout, weights)[: len(order)] == list(order):
            return rollout


def auth(rollout: uuid.UUID) -> dict[str, str]:
    return {"authorization": f"Bearer {issue_rollout_token(SECRET, rollout, 600)}"}


def chat_body(stream: bool = False, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "policy", "messages": QUESTION, "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


@dataclass
class Stack:
    """The proxy at `url`, its rows in `sink`, the fakes by backend name (their URL)."""

    url: str
    sink: MemoryCallSink
    fakes: dict[str, Starlette]
    client: httpx.Client = field(
        default_factory=lambda: httpx.Client(timeout=30, verify=client_ssl_context())
    )

    def stats(self, backend: str) -> FakeStats:
        stats: FakeStats = self.fakes[backend].state.stats
        return stats

    def chat(
        self, rollout: uuid.UUID, stream: bool = False, max_tokens: int | None = None
    ) -> httpx.Response:
        body = chat_body(stream, max_tokens)
        return self.client.post(f"{self.url}{CHAT}", json=body, headers=auth(rollout))

    def admin(self, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
        return self.client.request(
            method, f"{self.url}{path}", json=body, params=params, headers=ADMIN
        )

    def backends(self) -> dict[str, dict[str, Any]]:
        response = self.admin("GET", "/admin/backends")
        assert response.status_code == 200, response.text
        return {b["name"]: b for b in response.json()["backends"]}

    def rows_of(self, rollout: uuid.UUID) -> list[dict[str, Any]]:
        return [r for r in self.sink.rows if r["rollout_id"] == rollout]


@contextmanager
def proxy_stack(
    n_fakes: int = 2,
    token_delay_s: float = 0.0,
    extra_urls: tuple[str, ...] = (),
    sink: CallSink | None = None,
    **settings: Any,
) -> Iterator[Stack]:
    """`n_fakes` in-thread fakes (+ `extra_urls`, e.g. fake processes) behind one proxy.

    Rows go to `sink` (default: a `MemoryCallSink`, then `Stack.sink`)."""
    with ExitStack() as stack:
        fakes: dict[str, Starlette] = {}
        for _ in range(n_fakes):
            fake = create_fake_vllm_app(token_delay_s=token_delay_s)
            fakes[stack.enter_context(serve_in_thread(fake))] = fake
        values: dict[str, Any] = {
            "upstream_urls": [*extra_urls, *fakes],
            "proxy_admin_token": ADMIN_TOKEN,
            "health_interval_s": 0.1,
            "health_timeout_s": 1.0,
            "breaker_failures": 2,
            "breaker_cooldown_s": 0.5,
        }
        values.update(settings)
        memory = MemoryCallSink()
        app = create_proxy_app(proxy_settings(**values), sink=sink or memory)
        url = stack.enter_context(serve_in_thread(app, server="lean"))
        s = Stack(url, memory, fakes)
        stack.callback(s.client.close)
        yield s


class FakeProcess:
    """`python -m polar_mq.testing.fake_vllm` on a fixed port: it can be killed and restarted."""

    def __init__(self, token_delay_ms: float = 0.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token_delay_ms = token_delay_ms
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm", "--port", str(self.port)]
        argv += ["--token-delay-ms", str(self.token_delay_ms)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._healthy, 30)

    def _healthy(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, "fake engine exited"
        try:
            return FRESH_HTTP.get(f"{self.url}/health").status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        """SIGKILL: the engine dies without closing anything, as a crashed server does."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def __enter__(self) -> FakeProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
