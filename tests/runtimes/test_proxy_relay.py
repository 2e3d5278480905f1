"""ProxyRelay alone: the node's half of `network: proxy_only`, without a sandbox around it.

The relay serves one Unix socket per command and connects each connection to the recorded proxy
address only. Sockets in a long runtime path (over the 108-byte limit of a socket path) work: the
docker runtime binds them in `<runtime>/relay`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from runtime_backends import tcp_listener

from polar_mq.runtimes import identity
from polar_mq.runtimes.proxy_relay import ProxyRelay, record_route, recorded_route


def through(path: Path) -> bytes:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        client.connect(f"/proc/self/fd/{fd}/{path.name}")
        return client.recv(4)
    finally:
        os.close(fd)
        client.close()


@pytest.mark.parametrize("shared", [False, True])
def test_relay_reaches_the_target_and_cleans_up(tmp_path: Path, shared: bool) -> None:
    directory = tmp_path / ("d" * 100) / "relay" if shared else None
    if directory is not None:
        directory.mkdir(parents=True)
    agent = identity.node_identity()
    with tcp_listener() as port, ProxyRelay(("127.0.0.1", port), agent, directory) as relay:
        assert len(str(relay.socket_path)) > 108 or not shared
        assert (relay.socket_path.stat().st_mode & 0o777) == 0o600
        assert through(relay.socket_path) == b"pong"
        assert through(relay.socket_path) == b"pong"  # one connection after another
    assert not relay.socket_path.exists()
    if directory is not None:  # a shared directory stays, only the command's socket goes
        assert directory.is_dir() and list(directory.iterdir()) == []
        assert relay.socket_name != "proxy.sock"


def test_routes_are_recorded_for_later_handles(tmp_path: Path) -> None:
    assert recorded_route(tmp_path) is None
    assert record_route(tmp_path, "http://10.0.0.5:8080/v1?x=1") == "http://127.0.0.1:8010/v1?x=1"
    assert recorded_route(tmp_path) == ("10.0.0.5", 8080)
    assert record_route(tmp_path, "http://proxy.internal/v1") == "http://127.0.0.1:8010/v1"
    assert recorded_route(tmp_path) == ("proxy.internal", 80)
    with pytest.raises(ValueError, match="plain http"):
        record_route(tmp_path, "https://proxy.internal/v1")
