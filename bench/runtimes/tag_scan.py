"""What a `local` runtime's stop costs on a node busy with other rollouts' agents.

`python -m bench.runtimes.tag_scan [--others 1000] [--repeats 50]` (as root: the other agents run
as another user). A stop kills every process carrying the runtime's tag (`kill_tagged`), found by
reading process environments. It starts a real `local` runtime and `--others` sleeping processes
as `nobody`, each tagged with an id of its own (other rollouts' agents), then times the scan for
the runtime's processes: over every process of the node (the baseline, `tagged_pids` without
users) and as the runtime itself does it (`LocalRuntime.alive_processes`: the processes of the
users its commands can run as). Prints the median CPU ms per scan of each and their ratio, and
writes them to `bench/results/`.

`--stops N` also times N whole stops on that busy node (median wall ms of `stop()`, for a runtime
whose one command left a background process): with a kill group and a pool uid the stop kills the
group, sweeps the uid's processes and its shared temporary files; without, it scans the tags.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson

from polar_mq.config import get_settings
from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.host_exec import tagged_pids
from polar_mq.runtimes.process_kit import RUNTIME_TAG

NOBODY = 65534
RESULTS = Path(__file__).resolve().parents[1] / "results"


def _cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        samples.append(1000 * (time.process_time() - t0))
    return statistics.median(samples)


def _stop_ms(count: int) -> float:
    """Median wall ms of `stop()` for fresh runtimes whose one command left a daemon behind."""
    samples = []
    for i in range(count):
        rid = f"bench-stop-{uuid.uuid4().hex[:8]}-{i}"
        runtime = LocalRuntime(rid, get_settings().runtime_root)
        runtime.start()
        runtime.exec("(sleep 600 </dev/null >/dev/null 2>&1 &); true", timeout=30)
        t0 = time.perf_counter()
        runtime.stop()
        samples.append(1000 * (time.perf_counter() - t0))
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtimes.tag_scan")
    parser.add_argument("--others", type=int, default=1000, help="other agents' processes")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--stops", type=int, default=0, help="also time this many stops")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("run as root: the other agents' processes run as nobody")
        return 2
    rid = f"bench-{uuid.uuid4().hex[:8]}"
    runtime = LocalRuntime(rid, get_settings().runtime_root)  # where the agent user may enter
    runtime.start()
    others = [
        subprocess.Popen(["sleep", "600"], env={RUNTIME_TAG: f"other-{i}"}, user=NOBODY)
        for i in range(opts.others)
    ]
    try:
        time.sleep(0.5)  # every one exec'd: its environment is sleep's
        processes = len(os.listdir("/proc"))
        full = _cpu_ms(lambda: tagged_pids(rid), opts.repeats)
        owned = _cpu_ms(runtime.alive_processes, opts.repeats)
        stop_ms = _stop_ms(opts.stops) if opts.stops else None
    finally:
        for p in others:
            p.kill()
        for p in others:
            p.wait()
        runtime.stop()
    print(f"node: ~{processes} /proc entries, {opts.others} of them other agents (nobody)")
    print(f"  every process (baseline)     {full:8.2f} ms CPU per stop's scan")
    print(f"  its users' processes only    {owned:8.2f} ms CPU per stop's scan")
    print(f"  ratio                        {owned / full:8.2f}")
    if stop_ms is not None:
        print(f"  stop() with a daemon left    {stop_ms:8.2f} ms wall (median of {opts.stops})")
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS / f"tag_scan-{stamp}.json"
    figures = {"others": opts.others, "full_ms": full, "owned_ms": owned, "stop_ms": stop_ms}
    out.write_bytes(orjson.dumps(figures))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
