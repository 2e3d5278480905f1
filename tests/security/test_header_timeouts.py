"""Half-sent request heads are cut after `header_read_timeout_s`, by the real API and proxy.

Slowloris: clients open many connections, send part of a request line and headers (or nothing,
or a whole request and then half of the next one on the same connection) and stall. Before, each
such connection stayed open as long as the client wished (300 of them for 75 s and more), on
uvicorn (the API) and on the proxy's own server alike. Each must now
be closed by the server (a 408 when part of a head came) before a generous deadline, while a
normal request is still served, and a head sent in pieces within the deadline is answered.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TIMEOUT_S = 1.0
DEADLINE_S = 30.0
"""Generous: every stalled connection must be closed long before this (the setting is 1 s)."""
STALLED = 50
SERVERS = ("api", "proxy")


def _env(pg_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    env.update(
        POLAR_MQ_DATABASE_URL=pg_url,
        POLAR_MQ_BROKER_URL="redis://127.0.0.1:6379/3",
        POLAR_MQ_QUEUE_PREFIX=f"ht{uuid.uuid4().hex[:8]}",
        POLAR_MQ_SECRET_KEY="header-timeout-secret-" + uuid.uuid4().hex,
        POLAR_MQ_HEADER_READ_TIMEOUT_S=str(TIMEOUT_S),
        POLAR_MQ_PROXY_SPILL_MAX_BYTES="0",
        POLAR_MQ_UPSTREAM_URL="http://127.0.0.1:9",  # never reached: no request is forwarded
        **extra,
    )
    return env


@pytest.fixture(scope="module")
def servers(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """The API and the proxy, each a real `polar-mq` process."""
    tmp = tmp_path_factory.mktemp("header-timeouts")
    ports = {name: free_port() for name in SERVERS}
    procs = []
    try:
        for name, port in ports.items():
            env = _env(pg_url, POLAR_MQ_API_PORT=str(port), POLAR_MQ_PROXY_PORT=str(port))
            argv = [sys.executable, "-m", "polar_mq.cli", name]
            procs.append(ManagedProcess(name, argv, env, Path(tmp), fork=True).start())
        for proc, port in zip(procs, ports.values(), strict=True):
            proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield ports
    finally:
        for proc in procs:
            proc.stop()


def _connect(port: int, first: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    if first:
        sock.sendall(first)
    return sock


def _closed_by_server(sock: socket.socket, deadline: float) -> bytes:
    """Everything the server sent until it closed the connection; fails if it is still open at
    `deadline` (a monotonic time)."""
    received = b""
    with sock:
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"still open after {DEADLINE_S:g} s: {received!r}") from None
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
WHOLE = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize("server", SERVERS)
def test_half_sent_heads_are_closed_while_others_are_served(
    servers: dict[str, int], server: str
) -> None:
    port = servers[server]
    deadline = time.monotonic() + DEADLINE_S
    half = [_connect(port, HALF_HEAD) for _ in range(STALLED)]
    silent = _connect(port, b"")  # connected, never a byte
    second = _connect(port, WHOLE + HALF_HEAD)  # a whole request, then half of the next
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        assert client.get("/healthz").status_code == 200  # served meanwhile
    for sock in half:
        answer = _closed_by_server(sock, deadline)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"request headers not received within 1 s" in answer
    assert _closed_by_server(silent, deadline) == b""
    answers = _closed_by_server(second, deadline)
    assert answers.startswith(b"HTTP/1.1 200"), answers[:200]  # the whole request was served
    assert answers.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 408" in answers
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        assert client.get("/healthz").status_code == 200  # and still serving after
    with _connect(port, b"GET /healthz HTTP/1.1\r\n") as sock:  # a head in pieces, in time
        sock.sendall(b"Host: 127.0.0.1\r\n")
        sock.sendall(b"Connection: close\r\n\r\n")
        answer = _closed_by_server(sock, time.monotonic() + DEADLINE_S)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
