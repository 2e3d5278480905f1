"""Half-sent bodies are cut after `body_read_timeout_s`, by the real API and proxy processes.

Clients open raw sockets, send the headers and part of a body, and stall. Each must get a 408 in
the server's error shape and see the connection closed within the bound, and the servers must keep
serving everyone else; a body that completes in time, and a long poll waiting after its body, are
not affected.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job

pytestmark = pytest.mark.timeout(240)

TIMEOUT_S = 1.0
BOUND_S = TIMEOUT_S + 4.0
SECRET = "body-timeout-secret-" + uuid.uuid4().hex
STALLED = 20


def _env(pg_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    env.update(
        POLAR_MQ_DATABASE_URL=pg_url,
        POLAR_MQ_BROKER_URL="redis://127.0.0.1:6379/3",
        POLAR_MQ_QUEUE_PREFIX=f"bt{uuid.uuid4().hex[:8]}",
        POLAR_MQ_SECRET_KEY=SECRET,
        POLAR_MQ_BODY_READ_TIMEOUT_S=str(TIMEOUT_S),
        POLAR_MQ_PROXY_SPILL_MAX_BYTES="0",
        POLAR_MQ_UPSTREAM_URL="http://127.0.0.1:9",  # never reached: bodies never complete
        **extra,
    )
    return env


@pytest.fixture(scope="module")
def servers(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """The API and the proxy, each a real `polar-mq` process; their ports by name."""
    tmp = tmp_path_factory.mktemp("body-timeouts")
    ports = {"api": free_port(), "proxy": free_port()}
    env = _env(pg_url, POLAR_MQ_API_PORT=str(ports["api"]), POLAR_MQ_PROXY_PORT=str(ports["proxy"]))
    procs = []
    try:
        for name in ports:
            argv = [sys.executable, "-m", "polar_mq.cli", name]
            proc = ManagedProcess(name, argv, env, Path(tmp), fork=True).start()
            procs.append(proc)
            health = "/healthz"
            proc.wait_http(f"http://127.0.0.1:{ports[name]}{health}")
        yield ports
    finally:
        for proc in procs:
            proc.stop()


def half_request(port: int, path: str, headers: dict[str, str]) -> tuple[float, bytes]:
    """Send headers and half a body, stall; (seconds until the server closed, what it sent)."""
    body = b'{"tasks": [{"instruction": "stall'
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()] + [f"Content-Length: {len(body) * 4}"]
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S + 5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return time.monotonic() - started, received
            received += chunk


def response_body(raw: bytes) -> dict[str, object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), raw[:200]
    document: dict[str, object] = orjson.loads(body)
    return document


def stall_many(port: int, path: str, headers: dict[str, str]) -> list[tuple[float, bytes]]:
    with concurrent.futures.ThreadPoolExecutor(STALLED) as pool:
        futures = [pool.submit(half_request, port, path, headers) for _ in range(STALLED)]
        return [f.result() for f in futures]


def test_the_api_cuts_half_sent_bodies(servers: dict[str, int]) -> None:
    results = stall_many(servers["api"], "/v1/jobs", {})
    for elapsed, raw in results:
        assert TIMEOUT_S * 0.9 <= elapsed <= BOUND_S, elapsed
        error = response_body(raw)["error"]
        assert isinstance(error, dict) and error["type"] == "request_timeout", error
    with httpx.Client(base_url=f"http://127.0.0.1:{servers['api']}", timeout=10) as client:
        assert client.get("/healthz").status_code == 200  # still serving


def test_the_proxy_cuts_half_sent_bodies_in_each_family_shape(
    servers: dict[str, int], db_session_factory: sessionmaker[Session]
) -> None:
    with unit_of_work(db_session_factory) as session:  # the proxy serves live rollouts only
        job = create_job(session, JobCreate.model_validate({"tasks": [{"instruction": "x"}]}), "p")
    token = issue_rollout_token(SECRET, job.rollout_ids[0], 600)
    port = servers["proxy"]
    bearer = {"Authorization": f"Bearer {token}"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the three shapes stall at once
        messages = pool.submit(half_request, port, "/v1/messages", {"x-api-key": token})
        admin = pool.submit(half_request, port, "/admin/backends", {})  # loopback admin, dev
        for elapsed, raw in stall_many(port, "/v1/chat/completions", bearer):
            assert elapsed <= BOUND_S, elapsed
            openai = response_body(raw)["error"]
            assert isinstance(openai, dict) and openai["code"] == "request_timeout", openai
        elapsed, raw = messages.result()
        anthropic = response_body(raw)
        assert anthropic["type"] == "error" and elapsed <= BOUND_S, anthropic
        elapsed, raw = admin.result()
        assert response_body(raw)["error"] and elapsed <= BOUND_S


def test_a_body_that_arrives_in_time_is_served(
    servers: dict[str, int], db_session_factory: sessionmaker[Session]
) -> None:
    """Slow but within the deadline: the job is created (and emptied after, with the tables)."""
    body = orjson.dumps({"tasks": [{"instruction": "x"}]})
    lines = ["POST /v1/jobs HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    with socket.create_connection(("127.0.0.1", servers["api"]), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body[:5])
        time.sleep(TIMEOUT_S / 3)
        sock.sendall(body[5:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]


def test_a_long_poll_after_its_body_is_not_cut(
    servers: dict[str, int], db_session_factory: sessionmaker[Session]
) -> None:
    """The job it creates is emptied after, with the tables (`db_session_factory`)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{servers['api']}", timeout=30) as client:
        job = client.post("/v1/jobs", json={"tasks": [{"instruction": "x"}]}).json()["job_id"]
        started = time.monotonic()
        lease = client.post(
            f"/v1/jobs/{job}/groups/lease", json={"consumer": "c", "wait_s": TIMEOUT_S * 2.5}
        )
    assert lease.status_code == 200, lease.text
    assert time.monotonic() - started >= TIMEOUT_S * 2
