"""The lean HTTP/1.1 server (`polar_mq.proxy.server.http_server`) over real sockets, byte by byte.

The proxy's other tests drive the app in-process or through this server; these check what only
the server decides: framing, keep-alive, pipelining, malformed input, large and slow bodies, a
client hanging up mid-stream, the routes that go to the app's slow path, and the upgrade hand-off.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.fake_vllm import FakeStats, create_fake_vllm_app
from polar_mq.testing.servers import serve_in_thread

CHAT = b"/v1/chat/completions"


@dataclass
class Served:
    host: str
    port: int
    sink: MemoryCallSink
    stats: FakeStats

    def connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def wait_rows(self, count: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.sink.rows) < count:
            assert time.monotonic() < deadline, f"{len(self.sink.rows)} rows, wanted {count}"
            time.sleep(0.01)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    fake = create_fake_vllm_app(token_delay_s=0.02)
    sink = MemoryCallSink()
    with serve_in_thread(fake) as upstream:
        settings = proxy_settings(upstream_url=upstream, body_read_timeout_s=0.5)
        app = create_proxy_app(settings, sink=sink)
        with serve_in_thread(app, server="lean") as url:
            host, port = url.removeprefix("http://").split(":")
            yield Served(host, int(port), sink, fake.state.stats)


def token() -> str:
    return issue_rollout_token(SECRET, uuid.uuid4(), 600)


def request(
    path: bytes = CHAT,
    body: bytes | None = None,
    method: bytes = b"POST",
    extra: bytes = b"",
) -> bytes:
    if body is None:
        message = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
        body = orjson.dumps(message)
    auth = b"authorization: Bearer " + token().encode() + b"\r\n"
    head = b"%b %b HTTP/1.1\r\nhost: proxy\r\n%b%b" % (method, path, auth, extra)
    if method == b"GET":
        return head + b"\r\n"
    return head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )


class Reader:
    """Reads HTTP/1.1 responses (length-delimited or chunked) off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            assert self._fill(), "connection closed mid-response"
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self.buf) < size:
            assert self._fill(), "connection closed mid-body"
        data, self.buf = self.buf[:size], self.buf[size:]
        return data

    def response(self) -> tuple[int, dict[bytes, bytes], bytes]:
        status = int(self._line().split(b" ")[1])
        headers: dict[bytes, bytes] = {}
        while line := self._line():
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            return status, headers, self._exactly(int(headers[b"content-length"]))
        assert headers.get(b"transfer-encoding") == b"chunked", headers
        body = b""
        while size := int(self._line(), 16):
            body += self._exactly(size)
            assert self._exactly(2) == b"\r\n"
        assert self._line() == b""
        return status, headers, body

    def closed(self) -> bool:
        """True when the server closed the connection (and sent nothing more)."""
        return not self.buf and not self._fill()


def test_keep_alive_serves_several_calls_on_one_connection(served: Served) -> None:
    rows = len(served.sink.rows)
    with served.connect() as sock:
        reader = Reader(sock)
        for _ in range(3):
            sock.sendall(request())
            status, headers, body = reader.response()
            assert status == 200 and b"connection" not in headers
            assert orjson.loads(body)["choices"][0]["message"]["content"] == "CALC: 2 + 3"
            assert b"date" in headers and headers[b"content-type"] == b"application/json"
    served.wait_rows(rows + 3)


def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(
            request() + request(b"/healthz", method=b"GET") + request(b"/v1/models", method=b"GET")
        )
        reader = Reader(sock)
        first, second, third = reader.response(), reader.response(), reader.response()
    assert first[0] == 200 and b"choices" in first[2]
    assert second[0] == 200 and orjson.loads(second[2])["status"] == "ok"
    assert third[0] == 200 and orjson.loads(third[2])["data"][0]["id"] == "fake-model"


def assert_refused_then_still_serving(served: Served, sock: socket.socket) -> None:
    """`sock` got a 400 and was closed; a new connection is served as before."""
    reader = Reader(sock)
    status, headers, _ = reader.response()
    assert status == 400 and headers[b"connection"] == b"close"
    assert reader.closed()
    with served.connect() as fresh:
        fresh.sendall(request(b"/healthz", method=b"GET"))
        assert Reader(fresh).response()[0] == 200


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: nope\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
    ],
)
def test_malformed_request_is_a_400_and_the_server_goes_on(served: Served, garbage: bytes) -> None:
    with served.connect() as sock:
        sock.sendall(garbage)
        assert_refused_then_still_serving(served, sock)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n"
        + b"x-filler: "
        + b"b" * 8_000
        + b"\r\n" * 1
        + b"".join(b"x-more-%d: %s\r\n" % (i, b"c" * 8_000) for i in range(9))
        + b"\r\n",
    ],
    ids=["long-url", "many-headers"],
)
def test_an_oversized_request_head_is_a_400_and_closes(served: Served, head: bytes) -> None:
    with served.connect() as sock:
        with contextlib.suppress(OSError):  # the server may close before all of it is sent
            sock.sendall(head)
        assert_refused_then_still_serving(served, sock)


def test_bad_request_after_a_good_one_answers_the_good_one_first(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(request() + b"\x00\x01garbage\r\n\r\n")
        reader = Reader(sock)
        assert reader.response()[0] == 200
        assert reader.response()[0] == 400
        assert reader.closed()


def test_large_body_in_pieces_and_chunked_bodies_are_read_whole(served: Served) -> None:
    filler = "x" * 3_000  # within the fake's context; sent in many reads
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": filler}]})
    rows = len(served.sink.rows)
    with served.connect() as sock:
        reader = Reader(sock)
        data = request(body=body)
        for i in range(0, len(data), 500):
            sock.sendall(data[i : i + 500])
            time.sleep(0.005)
        assert reader.response()[0] == 200
        head = request(body=b"").split(b"content-length")[0]
        chunks = b"".join(
            b"%x\r\n%b\r\n" % (len(body[i : i + 700]), body[i : i + 700])
            for i in range(0, len(body), 700)
        )
        sock.sendall(head + b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
        assert reader.response()[0] == 200
    served.wait_rows(rows + 2)
    assert served.sink.rows[-1]["request"]["messages"][0]["content"] == filler


def test_oversized_body_is_a_413_and_the_connection_closes(served: Served) -> None:
    body = b"{" + b" " * (70 * 1024) + b"}"
    with served.connect() as sock:
        sock.sendall(request(body=body)[:2000])  # declared length is enough to refuse
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 413 and headers[b"connection"] == b"close"
        assert reader.closed()


def test_stalled_body_is_a_408(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(request()[:-10])  # the last bytes never come
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 408 and headers[b"connection"] == b"close"
        assert reader.closed()


def test_expect_100_continue_gets_the_interim_answer(served: Served) -> None:
    data = request(extra=b"expect: 100-continue\r\n")
    head, body = data.split(b"\r\n\r\n", 1)
    with served.connect() as sock:
        sock.sendall(head + b"\r\n\r\n")
        reader = Reader(sock)
        assert reader._line() == b"HTTP/1.1 100 Continue"
        assert reader._line() == b""
        sock.sendall(body)
        assert reader.response()[0] == 200


def test_streams_are_chunked_and_a_hang_up_mid_stream_aborts_upstream(served: Served) -> None:
    message = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "What is 12 * 34?"}],
    }
    rows, aborted = len(served.sink.rows), served.stats.streams_aborted
    with served.connect() as sock:  # a whole stream first
        sock.sendall(request(body=orjson.dumps(message)))
        status, headers, body = Reader(sock).response()
        assert status == 200 and headers[b"transfer-encoding"] == b"chunked"
        assert body.rstrip().endswith(b"data: [DONE]")
    with served.connect() as sock:
        sock.sendall(request(body=orjson.dumps(message)))
        received = b""
        while received.count(b"data: ") < 3:
            received += sock.recv(4096)
    served.wait_rows(rows + 2)
    deadline = time.monotonic() + 5
    while served.stats.streams_aborted == aborted:
        assert time.monotonic() < deadline, "upstream stream not aborted"
        time.sleep(0.01)
    assert served.sink.rows[rows]["complete"] is True
    partial = served.sink.rows[rows + 1]
    assert (partial["complete"], partial["status_code"]) == (False, 499)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        (b"GET", b"/metrics", 200),
        (b"GET", b"/", 200),
        (b"GET", CHAT, 405),  # a hot path with the wrong method goes to the app's router
        (b"POST", b"/nowhere", 404),
        (b"POST", b"/admin/flush", 200),  # no admin token configured
    ],
)
def test_other_routes_reach_the_app(
    served: Served, method: bytes, path: bytes, status: int
) -> None:
    with served.connect() as sock:
        sock.sendall(request(path, method=method, body=b"{}"))
        assert Reader(sock).response()[0] == status


def test_token_in_the_path_is_accepted(served: Served) -> None:
    raw = request(b"/r/" + token().encode() + CHAT).replace(b"authorization: Bearer", b"x-ignored:")
    with served.connect() as sock:
        sock.sendall(raw)
        assert Reader(sock).response()[0] == 200


def test_upgrade_request_is_handed_to_uvicorn(served: Served) -> None:
    upgrade = (
        b"GET /healthz HTTP/1.1\r\nhost: proxy\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
        b"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with served.connect() as sock:
        sock.sendall(upgrade)
        first = sock.recv(4096)
    # The app has no websocket route: uvicorn refuses the handshake (403), never our 400.
    assert first.startswith(b"HTTP/1.1 ") and not first.startswith(b"HTTP/1.1 400")


def test_idle_keep_alive_connections_stay_usable_between_calls(served: Served) -> None:
    with served.connect() as sock:
        reader = Reader(sock)
        sock.sendall(request(b"/healthz", method=b"GET"))
        assert reader.response()[0] == 200
        time.sleep(0.3)
        sock.sendall(request(b"/healthz", method=b"GET"))
        assert reader.response()[0] == 200
