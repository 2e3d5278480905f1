"""`free_port`: a port to listen on that outgoing connections, this process's earlier picks and
other processes' picks will not take first."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest

from polar_mq.infra import ports


@pytest.fixture(autouse=True)
def own_reservations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's reservations in a folder of its own, and a process memory of its own."""
    folder = tmp_path / "reservations"
    monkeypatch.setattr(ports, "RESERVATIONS", folder)
    monkeypatch.setattr(ports, "_handed_out", {})
    return folder


def test_ports_come_from_below_the_ephemeral_range_and_are_free() -> None:
    floor = ports._ephemeral_floor()
    if floor - ports.LISTEN_PORTS_FLOOR < 1_000:
        pytest.skip(f"no room below this machine's ephemeral range (starts at {floor})")
    picked = {ports.free_port() for _ in range(50)}
    assert all(ports.LISTEN_PORTS_FLOOR <= p < floor for p in picked)
    assert len(picked) > 40  # random, not one port handed out again and again
    for port in list(picked)[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free indeed


def test_a_taken_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        room = ports.LISTEN_PORTS_FLOOR + 5_000
        monkeypatch.setattr(ports, "_ephemeral_floor", lambda: room)
        monkeypatch.setattr(ports.random, "randrange", lambda _a, _b: port)
        assert ports.free_port() != port  # every pick was taken: the kernel picks one


def test_without_room_below_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_floor", lambda: 1024)
    port = ports.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack picks its engine's, proxy's and API's ports before starting any of them: each is
    still free when the next is picked, so only memory keeps two of them apart."""
    monkeypatch.setattr(ports, "_reserve", lambda _port: True)  # the process memory alone
    picks = [ports.free_port() for _ in range(2_000)]
    assert len(set(picks)) == len(picks)  # 2,000 random picks of ~22,000 ports: ~90 repeats


def test_the_memory_is_bounded_and_the_kernel_fallback_respects_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "RECENT_PORTS", 10)
    monkeypatch.setattr(ports, "_ephemeral_floor", lambda: 1024)  # the kernel picks
    picks = [ports.free_port() for _ in range(30)]
    assert len(set(picks[-10:])) == 10
    assert len(ports._handed_out) == 10
    assert list(ports._handed_out) == picks[-10:]


def test_a_port_another_process_reserved_is_skipped_until_its_claim_is_old(
    own_reservations: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    room = ports.LISTEN_PORTS_FLOOR + 5_000
    monkeypatch.setattr(ports, "_ephemeral_floor", lambda: room)
    claimed, other = ports.LISTEN_PORTS_FLOOR + 17, ports.LISTEN_PORTS_FLOOR + 18
    picks = iter([claimed, other])
    monkeypatch.setattr(ports.random, "randrange", lambda _a, _b: next(picks))
    own_reservations.mkdir()
    (own_reservations / str(claimed)).touch()  # another process's claim, just made
    assert ports.free_port() == other
    assert (own_reservations / str(other)).is_file()  # claimed in turn

    monkeypatch.setattr(ports, "_handed_out", {})
    old = time.time() - ports.RESERVE_S - 1
    os.utime(own_reservations / str(claimed), (old, old))
    monkeypatch.setattr(ports.random, "randrange", lambda _a, _b: claimed)
    assert ports.free_port() == claimed  # an old claim is taken over
    assert time.time() - (own_reservations / str(claimed)).stat().st_mtime < 5


def test_an_unusable_folder_leaves_the_bind_check_and_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(ports, "RESERVATIONS", blocker / "reservations")  # cannot be made
    picks = [ports.free_port() for _ in range(20)]
    assert len(set(picks)) == 20


def test_processes_picking_at_once_never_get_the_same_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes pick 300 ports each from a range of 1,000 at the same time (the test
    workers' stacks, started side by side): without reservations ~90 would be picked by both."""
    room = ports.LISTEN_PORTS_FLOOR + 1_000
    monkeypatch.setattr(ports, "_ephemeral_floor", lambda: room)
    fork = multiprocessing.get_context("fork")  # the children inherit the patched module
    start, results = fork.Event(), fork.Queue()

    def pick_many() -> None:
        start.wait(10)
        results.put([ports.free_port() for _ in range(300)])

    children = [fork.Process(target=pick_many) for _ in range(2)]
    for child in children:
        child.start()
    start.set()
    first, second = results.get(timeout=60), results.get(timeout=60)
    for child in children:
        child.join(10)
    assert len(set(first)) == len(set(second)) == 300
    assert not set(first) & set(second)
