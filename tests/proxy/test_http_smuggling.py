"""Request smuggling against the proxy's own server and upstream client, over real sockets.

The same stack as `test_http_conformance` (a real proxy on the lean server in front of a scripted
hostile upstream, raw-socket agents). Agent side: every request whose framing two HTTP parsers
could read differently (a length and a chunked coding, two lengths, an odd transfer coding, a
doctored chunk size, bare LF line ends) is one 400 and a closed connection, and nothing of it
reaches the upstream; a request carried in another's body stays body bytes. Upstream side: an
answer framed ambiguously is a clean 502, logged as a failed call, on a connection never reused.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import orjson
import pytest
from test_http_conformance import ANSWER, Hostile, Proxy, answer, head, parse, read_all, stack

pytestmark = pytest.mark.slow

CALL = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "2 + 3?"}]})
"""A valid call: if a framing trick let a request through, the upstream would see it."""


def chunked(body: bytes, size: bytes | None = None) -> bytes:
    return (size or b"%x" % len(body)) + b"\r\n" + body + b"\r\n0\r\n\r\n"


AGENT_CASES: dict[str, bytes] = {
    # a length and a chunked coding: which one frames the body?
    "cl-then-te": head(b"content-length: %d\r\ntransfer-encoding: chunked\r\n" % len(CALL))
    + chunked(CALL),
    "te-then-cl": head(b"transfer-encoding: chunked\r\ncontent-length: %d\r\n" % len(CALL))
    + chunked(CALL),
    # lengths two parsers may read differently
    "two-lengths": head(b"content-length: %d\r\ncontent-length: 5\r\n" % len(CALL)) + CALL,
    "signed-length": head(b"content-length: +%d\r\n" % len(CALL)) + CALL,
    "spaced-length": head(b"content-length: %d %d\r\n" % divmod(len(CALL), 10)) + CALL,
    "length-list": head(b"content-length: %d, %d\r\n" % (len(CALL), len(CALL))) + CALL,
    # transfer codings (RFC 9112 6.1): chunked must be the only one, and last
    "chunked-not-last": head(b"transfer-encoding: chunked, identity\r\n") + chunked(CALL),
    "gzip-then-chunked": head(b"transfer-encoding: gzip, chunked\r\n") + chunked(CALL),
    "gzip-then-chunked-two-headers": head(
        b"transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n"
    )
    + chunked(CALL),
    "chunked-twice": head(b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n")
    + chunked(CALL),
    "xchunked": head(b"transfer-encoding: xchunked\r\n") + chunked(CALL),
    "obs-fold": head(b"transfer-encoding:\r\n chunked\r\n") + chunked(CALL),
    "space-before-colon": head(b"transfer-encoding : chunked\r\n") + chunked(CALL),
    "chunked-on-http-1.0": head(b"transfer-encoding: chunked\r\n").replace(
        b"HTTP/1.1", b"HTTP/1.0", 1
    )
    + chunked(CALL),
    # chunk sizes and chunk framing
    "chunk-size-0x": head(b"transfer-encoding: chunked\r\n") + chunked(CALL, b"0x%x" % len(CALL)),
    "chunk-size-negative": head(b"transfer-encoding: chunked\r\n") + chunked(CALL, b"-1"),
    "chunk-size-overflow": head(b"transfer-encoding: chunked\r\n")
    + chunked(CALL, b"1" + b"0" * 16 + b"%x" % len(CALL)),
    "chunk-extension-bare-lf": head(b"transfer-encoding: chunked\r\n")
    + b"%x;ext\n" % len(CALL)
    + CALL
    + b"\r\n0\r\n\r\n",
    "chunk-extension-control-char": head(b"transfer-encoding: chunked\r\n")
    + chunked(CALL, b'%x;a="\x00"' % len(CALL)),
    "no-crlf-after-chunk-data": head(b"transfer-encoding: chunked\r\n")
    + b"%x\r\n" % len(CALL)
    + CALL
    + b"0\r\n\r\n",
    "chunk-size-trailing-space": head(b"transfer-encoding: chunked\r\n")
    + chunked(CALL, b"%x " % len(CALL)),
    # httptools' lenient flags, each off: a control character in a value, a bare CR line end
    "control-char-in-value": head(b"x-a: 1\x01\r\ncontent-length: %d\r\n" % len(CALL)) + CALL,
    "bare-cr-line-end": head(b"x-a: 1\rcontent-length: %d\r\n" % len(CALL)) + CALL,
    "unknown-version": head(b"content-length: %d\r\n" % len(CALL)).replace(
        b"HTTP/1.1", b"HTTP/1.7", 1
    )
    + CALL,
    # bare LF line ends in the head: never two requests, here refused
    "bare-lf-head": head(b"content-length: %d\r\n" % len(CALL)).replace(b"\r\n", b"\n") + CALL,
    "bare-lf-one-header": head(b"content-length: %d\r\n" % len(CALL)).replace(
        b"host: proxy\r\n", b"host: proxy\n"
    )
    + CALL,
}


async def served(writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(answer(orjson.dumps(ANSWER)))
    return True


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Hostile, Proxy]]:
    with stack(served) as pair:
        yield pair


@pytest.mark.parametrize("case", list(AGENT_CASES))
def test_an_ambiguously_framed_request_is_one_400_and_never_reaches_the_upstream(
    case: str, shared: tuple[Hostile, Proxy]
) -> None:
    hostile, proxy = shared
    before = hostile.calls
    with proxy.connect() as sock:
        sock.sendall(AGENT_CASES[case])
        data = read_all(sock)  # then the proxy closes
    status, headers, body = parse(data)  # exactly one response
    assert (status, headers[b"connection"], body) == (400, b"close", b"Bad Request")
    assert hostile.calls == before
    # the same proxy serves a well-framed call: the upstream above was reachable
    assert proxy.call()[0] == 200
    assert hostile.calls == before + 1


def keep_alive_head(length: int) -> bytes:
    return head(b"content-length: %d\r\n" % length).replace(b"close", b"keep-alive", 1)


@pytest.mark.parametrize("where", ["in-the-body", "after-the-body"])
def test_a_request_inside_a_body_is_body_bytes(where: str) -> None:
    """The control (`after-the-body`: the same bytes, the length covering the first call only)
    is served as two calls."""
    inner = head(b"content-length: %d\r\n" % len(CALL)) + CALL
    length = len(CALL) + len(inner) if where == "in-the-body" else len(CALL)
    with stack(served) as (hostile, proxy), proxy.connect() as sock:
        sock.sendall(keep_alive_head(length) + CALL + inner)
        wanted = 1 if where == "in-the-body" else 2
        statuses = [status for status, _, _ in read_responses(sock, wanted)]
        if where == "in-the-body":
            assert statuses == [400]  # the JSON has trailing bytes: a bad call, not two
            assert hostile.calls == 0
        else:
            assert statuses == [200, 200]
            assert hostile.calls == 2


def read_responses(sock: socket.socket, wanted: int) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Responses until `wanted` came, then anything more the proxy sends before it closes: the
    agent's write side is shut after them, so a further request would be answered too."""
    data = b""
    found: list[tuple[int, dict[bytes, bytes], bytes]] = []
    sock.settimeout(10)
    while len(found) < wanted:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(found)} responses: {data!r}"
        data += chunk
        found, data = split_responses(data, found)
    sock.shutdown(socket.SHUT_WR)
    rest = read_all(sock)
    assert data + rest == b"", f"bytes after {wanted} responses: {(data + rest)[:300]!r}"
    return found


def split_responses(
    data: bytes, found: list[tuple[int, dict[bytes, bytes], bytes]]
) -> tuple[list[tuple[int, dict[bytes, bytes], bytes]], bytes]:
    """Whole responses with a content length off the front of `data` (the proxy's answers here)."""
    while b"\r\n\r\n" in data:
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in raw_head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            break
        whole = raw_head + b"\r\n\r\n" + rest[:length]
        found = [*found, parse(whole)]
        data = rest[length:]
    return found, data


UPSTREAM_CASES: dict[str, bytes] = {
    "cl-then-te": b"content-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "te-then-cl": b"transfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "two-lengths": b"content-length: 2\r\ncontent-length: 7\r\n\r\n{}",
    "negative-length": b"content-length: -2\r\n\r\n{}",
    "garbage-length": b"content-length: 2x\r\n\r\n{}",
    "chunked-not-last": b"transfer-encoding: chunked, gzip\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "gzip-then-chunked": b"transfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "chunked-on-http-1.0": b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "obs-fold-length": b"x-a: 1\r\n content-length: 2\r\n\r\n{}",
}


@pytest.mark.parametrize("case", list(UPSTREAM_CASES))
def test_an_ambiguously_framed_answer_is_a_clean_502_on_a_connection_never_reused(
    case: str,
) -> None:
    async def hostile_once(writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            version = b"HTTP/1.0" if case.endswith("http-1.0") else b"HTTP/1.1"
            writer.write(
                version + b" 200 OK\r\ncontent-type: application/json\r\n" + UPSTREAM_CASES[case]
            )
        else:
            writer.write(answer(orjson.dumps(ANSWER)))
        return True  # kept open: the proxy must not send the next call on it

    with stack(hostile_once) as (hostile, proxy):
        status, headers, body = proxy.call()
        assert status == 502, body
        assert headers[b"content-type"].startswith(b"application/json")
        assert orjson.loads(body)["error"]["type"] == "upstream_error"
        assert proxy.call()[0] == 200
        rows = proxy.rows(2)
        assert [(row["status_code"], row["complete"]) for row in rows] == [
            (502, False),
            (200, True),
        ]
        assert (hostile.calls, hostile.call_connections) == (2, 2)
