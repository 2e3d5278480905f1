"""Cold vs warm runtime start per backend (local, bwrap, docker), with the prepare stage's own code.

Cold: `WarmPool.cold` — what prepare does when the pool is empty (start the sandbox, run the
recipe). Warm: `WarmPool.take` from a filled pool — what prepare does when it is not (claim a
marker, liveness check from the runtime's state). Reset (recycle) and teardown (destroy) are
timed on release. The recipe is a trivial one (`echo ready > ready.txt`), so the figures are the
sandbox's own cost; a real recipe adds its own duration to every cold start and to no warm one.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from polar_mq.runtimes.warm_pool import WarmPool

TEST_IMAGE = "polar-mq-runtime:test"


def unavailable(kind: str) -> str | None:
    if kind == "bwrap":
        from polar_mq.runtimes.bwrap import bwrap_available

        return bwrap_available()
    if kind == "docker":
        from polar_mq.runtimes.docker import default_client, docker_available

        reason = docker_available()
        if reason is None and not default_client().images.list(name=TEST_IMAGE):
            reason = f"image {TEST_IMAGE} missing (scripts/build_test_image.sh)"
        return reason
    return None


def _ms(values: list[float]) -> float:
    return round(1000.0 * statistics.median(values), 1) if values else float("nan")


def measure(root: Path, kind: str, repeats: int) -> dict[str, Any]:
    reason = unavailable(kind)
    if reason is not None:
        return {"kind": kind, "skipped": reason}
    spec: dict[str, Any] = {"kind": kind, "prepare": {"commands": ["echo ready > ready.txt"]}}
    if kind == "docker":
        spec["image"] = TEST_IMAGE
    pool = WarmPool(root / kind, max_runtimes=repeats + 4)
    cold, teardown, warm, reset = [], [], [], []
    try:
        for i in range(repeats):
            owner = f"{i:032x}-1"
            t0 = time.perf_counter()
            got = pool.cold(spec, owner, 120)
            cold.append(time.perf_counter() - t0)
            teardown.append(pool.release(got.runtime, owner, reuse=False)["teardown_s"])
        pool.fill_one(spec, 120)
        for i in range(repeats):
            owner = f"{i:032x}-2"
            t0 = time.perf_counter()
            taken = pool.take(spec, owner)
            warm.append(time.perf_counter() - t0)
            assert taken is not None, "the pool lost its runtime"
            reset.append(pool.release(taken.runtime, owner, reuse=True)["reset_s"])
    finally:
        pool.reap_idle(-1)
    return {
        "kind": kind,
        "cold_start_ms": _ms(cold),
        "warm_take_ms": _ms(warm),
        "speedup": round(statistics.median(cold) / statistics.median(warm), 1),
        "reset_ms": _ms(reset),
        "teardown_ms": _ms(teardown),
        "repeats": repeats,
    }
