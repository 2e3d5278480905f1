"""BwrapRuntime: namespaces, network policy and limits, checked from inside real sandboxes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_backends import Backend, backend_for, connect_command, tcp_listener, wait_for

from polar_mq.runtimes import ResourceLimits
from polar_mq.runtimes.base import ExecResult
from polar_mq.runtimes.bwrap import BwrapRuntime, StartedWith
from polar_mq.runtimes.cgroups import CgroupUnavailable, create
from tests.conftest import runtime_id


@pytest.fixture
def bwrap(tmp_path: Path) -> Iterator[Backend]:
    with backend_for("bwrap", tmp_path / "runtimes") as made:
        yield made


@pytest.mark.parametrize(("network", "expected"), [("host", "got pong"), ("none", "failed")])
def test_network_policy(bwrap: Backend, network: str, expected: str) -> None:
    rt = bwrap.make(f"rt-net-{network}", network=network)
    rt.start()
    with tcp_listener() as port:
        result = rt.exec(connect_command(bwrap.python, port), timeout=30)
    assert result.stdout_tail.startswith(expected), result
    if network == "none":
        interfaces = rt.exec("cat /proc/net/dev").stdout_tail
        assert "lo:" in interfaces and interfaces.count(":") == 1  # loopback only


def test_namespaces_read_only_system_and_no_capabilities(bwrap: Backend) -> None:
    rt = bwrap.make("rt-ns")
    rt.start()
    result = rt.exec(
        "hostname; echo $$; ls /proc | grep -c '^[0-9]'; grep CapEff /proc/self/status; "
        "touch /usr/polar-mq-probe 2>&1; touch /etc/polar-mq-probe 2>&1; echo done"
    )
    lines = result.stdout_tail.splitlines()
    assert lines[0] == "sandbox"  # own uts namespace
    assert int(lines[1]) <= 3 and int(lines[2]) <= 5  # own pid namespace: a handful of pids
    assert lines[3].split() == ["CapEff:", "0000000000000000"]
    assert "Read-only file system" in lines[4] and "Read-only file system" in lines[5]
    assert not Path("/usr/polar-mq-probe").exists()


def test_background_processes_end_with_their_command(bwrap: Backend) -> None:
    rt = bwrap.make("rt-bg")
    rt.start()
    started = time.monotonic()
    result = rt.exec("sleep 60 & echo started")
    assert result.ok and result.stdout_tail == "started\n"
    assert time.monotonic() - started < 5
    # the pid namespace goes with the command (the kernel kills its members asynchronously)
    wait_for(lambda: rt.alive_processes() == [], timeout=5, what="namespace members gone")


def test_memory_limit(bwrap: Backend) -> None:
    rt = bwrap.make("rt-mem", ResourceLimits(memory_mb=256))
    rt.start()
    hog = [bwrap.python, "-c", "x = bytearray(512 * 1024 * 1024); print('allocated')"]
    result = rt.exec(hog, timeout=60)
    assert result.exit_code == 1 and "MemoryError" in result.stderr_tail
    small = [bwrap.python, "-c", "x = bytearray(32 * 1024 * 1024); print('allocated')"]
    assert rt.exec(small, timeout=60).stdout_tail == "allocated\n"


def test_pids_limit_and_its_cgroup(bwrap: Backend) -> None:
    rt = bwrap.make("rt-pids", pids_limit=16)
    assert isinstance(rt, BwrapRuntime)
    rt.start()
    assert (rt.cgroup / "pids.max").read_text().strip() == "16"
    script = "n=0; while [ $n -lt 100 ]; do sleep 30 & n=$((n+1)); echo $n > count; done"
    result = rt.exec(script, timeout=30)
    started = int(rt.download("count"))
    assert started < 16 and "fork" in result.stderr_tail.lower(), result
    wait_for(lambda: rt.alive_processes() == [], timeout=5, what="namespace members gone")
    rt.stop()
    assert not rt.cgroup.exists()


def test_stop_from_another_handle_kills_a_running_exec_with_a_scrubbed_environment(
    bwrap: Backend,
) -> None:
    rt = bwrap.make("rt-scrubbed", pids_limit=64)
    rt.start()
    results: list[ExecResult] = []
    runner = threading.Thread(target=lambda: results.append(rt.exec("env -i sleep 300")))
    runner.start()
    deadline = time.monotonic() + 10
    while len(rt.alive_processes()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    bwrap.handle("rt-scrubbed").stop()
    runner.join(20)
    assert not runner.is_alive() and results[0].exit_code not in (0, None)
    assert rt.alive_processes() == []


def test_bad_options_and_missing_cgroup_support(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="network must be one of host, none"):
        BwrapRuntime(runtime_id("rt-x"), tmp_path, network="bridge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pids_limit"):
        BwrapRuntime(runtime_id("rt-x"), tmp_path, pids_limit=0)
    fake_fs = tmp_path / "cgroup"
    fake_fs.mkdir()
    with pytest.raises(CgroupUnavailable, match="no cgroup v1 pids controller"):
        create("rt-x", 10, fs=fake_fs)


def test_proxy_only_reaches_the_recorded_proxy_and_nothing_else(bwrap: Backend) -> None:
    """The agent's proxy URL points at the in-sandbox forwarder, which reaches the recorded
    address (through the worker's relay) and nothing else: the listener's own port is closed."""
    rt = bwrap.make("rt-proxy-only", network="proxy_only")
    rt.start()
    with tcp_listener() as port:
        url = rt.agent_proxy_url(f"http://127.0.0.1:{port}/v1")
        assert url == "http://127.0.0.1:8010/v1"
        # handles built later (the run-agent stage) relay to the same place
        again = bwrap.handle("rt-proxy-only")
        through = again.exec(connect_command(bwrap.python, 8010), timeout=30)
        direct = rt.exec(connect_command(bwrap.python, port), timeout=30)
    assert through.stdout_tail.startswith("got pong"), through
    assert direct.stdout_tail.startswith("failed"), direct
    interfaces = rt.exec("cat /proc/net/dev").stdout_tail
    assert "lo:" in interfaces and interfaces.count(":") == 1  # loopback only


def test_proxy_only_refuses_proxies_it_cannot_relay(bwrap: Backend) -> None:
    rt = bwrap.make("rt-proxy-https", network="proxy_only")
    rt.start()
    with pytest.raises(ValueError, match="plain http"):
        rt.agent_proxy_url("https://proxy.example:443/v1")
    host = bwrap.make("rt-proxy-host")
    host.start()
    assert host.agent_proxy_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"


def test_started_options_are_recorded_typed_and_read_back(tmp_path: Path) -> None:
    """No bubblewrap needed: the record a later handle builds its command line from."""
    unstarted = BwrapRuntime(runtime_id("rt-rec"), tmp_path, network="none", ro_binds=["/srv/x"])
    assert unstarted._recorded() == StartedWith("none", None, ("/srv/x",))  # its own options
    record = StartedWith("proxy_only", 64, (str(tmp_path),))
    assert StartedWith.parse(record.to_json()) == record
    later = BwrapRuntime(runtime_id("rt-rec"), tmp_path)  # another stage's handle: default options
    later.path.mkdir(parents=True, exist_ok=True)
    (later.path / "bwrap.json").write_bytes(StartedWith("none", None, (str(tmp_path),)).to_json())
    argv = later._sandbox_argv(["true"], later.workdir)
    triples = list(zip(argv, argv[1:], argv[2:], strict=False))
    assert "--unshare-net" in argv and ("--ro-bind", str(tmp_path), str(tmp_path)) in triples
    for bad in (b"{", b"[]", b'{"network": "bridge", "ro": []}', b'{"network": "none"}'):
        assert StartedWith.parse(bad) is None  # unreadable: the handle's own (the job's) options
    (later.path / "bwrap.json").write_bytes(b"{")
    assert (
        BwrapRuntime(runtime_id("rt-rec"), tmp_path, network="none")._recorded().network == "none"
    )
