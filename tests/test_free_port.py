"""`free_port`: a port to listen on that outgoing connections will not take first."""

from __future__ import annotations

import socket

import pytest

from polar_mq import processes


def test_ports_come_from_below_the_ephemeral_range_and_are_free() -> None:
    floor = processes._ephemeral_floor()
    if floor - processes.LISTEN_PORTS_FLOOR < 1_000:
        pytest.skip(f"no room below this machine's ephemeral range (starts at {floor})")
    ports = {processes.free_port() for _ in range(50)}
    assert all(processes.LISTEN_PORTS_FLOOR <= p < floor for p in ports)
    assert len(ports) > 40  # random, not one port handed out again and again
    for port in list(ports)[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free indeed


def test_a_taken_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        room = processes.LISTEN_PORTS_FLOOR + 5_000
        monkeypatch.setattr(processes, "_ephemeral_floor", lambda: room)
        monkeypatch.setattr(processes.random, "randrange", lambda _a, _b: port)
        assert processes.free_port() != port  # every pick was taken: the kernel picks one


def test_without_room_below_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_ephemeral_floor", lambda: 1024)
    port = processes.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack picks its upstream's, proxy's and API's ports before starting any of them: each is
    still free when the next is picked, so only memory keeps two of them apart."""
    monkeypatch.setattr(processes, "_handed_out", {})
    picks = [processes.free_port() for _ in range(2_000)]
    assert len(set(picks)) == len(picks)  # 2,000 random picks of ~22,000 ports: ~90 repeats


def test_the_memory_is_bounded_and_the_kernel_fallback_respects_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "_handed_out", {})
    monkeypatch.setattr(processes, "RECENT_PORTS", 10)
    monkeypatch.setattr(processes, "_ephemeral_floor", lambda: 1024)  # the kernel picks
    picks = [processes.free_port() for _ in range(30)]
    assert len(set(picks[-10:])) == 10
    assert len(processes._handed_out) == 10
    assert list(processes._handed_out) == picks[-10:]
