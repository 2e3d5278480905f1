"""The namespace bed itself: isolation, host kill, partition, and teardown after a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polar_mq.config import Settings
from polar_mq.testing.netns_bed import NetnsBed
from polar_mq.testing.netns_net import ip

pytestmark = [pytest.mark.e2e]
REDIS = "redis://127.0.0.1:6379/3"
PING = "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_timeout=2).ping()"


def _in_ns(bed: NetnsBed, index: int, *argv: str) -> int:
    ns = bed.network.hosts[index - 1].ns
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True).returncode


def _ours(tag: str) -> list[str]:
    return [line for line in ip("-o", "link").splitlines() + ip("netns", "list").splitlines()
            if tag in line]  # fmt: skip


def test_a_host_reaches_the_head_through_the_forwarder_and_a_cut_stops_it(
    tmp_path: Path,
) -> None:
    base = Settings(broker_url=REDIS, database_url="sqlite:///" + str(tmp_path / "db"))
    with NetnsBed(tmp_path, 1) as bed:
        bed.head_settings(base)
        host = bed.host_settings(1)
        assert host.broker_url.startswith(f"redis://{bed.head_address}:")
        assert _in_ns(bed, 1, sys.executable, "-c", PING, host.broker_url) == 0
        assert _in_ns(bed, 1, sys.executable, "-c", PING, REDIS) != 0, "loopback is the host's"
        bed.cut(1)
        assert _in_ns(bed, 1, sys.executable, "-c", PING, host.broker_url) != 0
        bed.heal(1)
        assert _in_ns(bed, 1, sys.executable, "-c", PING, host.broker_url) == 0
        assert bed.slow(1, 20) in ("netem", "tbf")
        bed.unslow(1)


def test_kill_host_leaves_nothing_running_and_teardown_survives_a_failure(
    tmp_path: Path,
) -> None:
    bed = NetnsBed(tmp_path, 2)
    with pytest.raises(RuntimeError, match="boom"), bed:
        bed.head_settings(Settings(broker_url=REDIS, database_url="sqlite:///x"))
        host = bed.start_node(1)  # a real node (its broker is up, its database need not be)
        ns = bed.network.hosts[0].ns
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"])
        assert host.node is not None and bed.processes(1)
        bed.kill_host(1)
        assert bed.processes(1) == [] and sleeper.wait(10) == -9
        assert host.kills == 1 and host.node is None
        raise RuntimeError("boom")
    assert _ours(bed.network.tag) == [], "namespaces and links removed after a failed test"
