"""The warm pool on its own: atomic claims across processes, liveness on take, recycling, bounds.

Real runtimes under a temporary root; the concurrency test races real processes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.warm_pool import WarmPool, is_pooled, pool_key
from polar_mq.spec import RuntimeSpec
from tests.runtimes.runtime_backends import TEST_IMAGE, skip_reason

RAW: dict[str, Any] = {
    "kind": "local",
    "prepare": {
        "files": {"lib/setup.txt": "from the recipe"},
        "commands": ["echo ran >> $HOME/../recipe-runs.log; mkdir -p built && echo ok > built/x"],
    },
}
SPEC = RuntimeSpec.model_validate(RAW)


def spec_of(raw: dict[str, Any]) -> RuntimeSpec:
    return RuntimeSpec.model_validate(raw)


def _recipe_runs(pool: WarmPool, runtime_id: str) -> int:
    log = pool.root / runtime_id / "recipe-runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_pool_key_names_the_sandbox_not_the_reuse_flags() -> None:
    assert pool_key(SPEC) == pool_key(spec_of({**RAW, "warm": True, "reuse": True}))
    assert pool_key(SPEC) == pool_key(spec_of({**RAW, "network": "host"}))
    assert pool_key(SPEC) != pool_key(spec_of({**RAW, "memory_mb": 512}))
    assert pool_key(SPEC) != pool_key(spec_of({**RAW, "prepare": {"commands": ["true"]}}))
    docker = RuntimeSpec(kind="docker", image="a")
    assert pool_key(docker) != pool_key(RuntimeSpec(kind="docker", image="b"))


def test_pool_key_is_stable_across_releases() -> None:
    """A node's idle runtimes keep their keys when the worker is upgraded (the values were
    computed by the release that hashed the stored spec dict)."""
    assert pool_key(RuntimeSpec()) == "cc4ba0999881"
    full = RuntimeSpec.model_validate(
        {"kind": "docker", "image": "img:1", "network": "proxy_only", "memory_mb": 256,
         "cpus": 1.5, "pids": 64, "prepare": {"files": {"b": "2", "a": "1"}, "commands": ["make"]}}
    )  # fmt: skip
    assert pool_key(full) == "23186cafa614"


def test_fill_take_and_recycle_keeps_the_recipe_but_resets_the_rest(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "rt")
    runtime_id = pool.fill_one(SPEC)
    assert is_pooled(runtime_id) and _recipe_runs(pool, runtime_id) == 1
    assert [m.state for m in pool.markers()] == ["idle"]

    got = pool.take(SPEC, "a" * 32 + "-1")
    assert got is not None and got.runtime.runtime_id == runtime_id
    assert got.detail["source"] == "pool" and got.detail["warm"] is True
    assert pool.take(SPEC, "b" * 32 + "-1") is None  # the only one is taken
    runtime = got.runtime
    assert (runtime.workdir / "built" / "x").read_text() == "ok\n"
    runtime.upload(b"{}", "task.json")
    runtime.exec("echo dirt > junk.txt; sleep 300 & echo $! > bg.pid")
    assert runtime.alive_processes()

    released = pool.release(runtime, "a" * 32 + "-1", reuse=True)
    assert released["action"] == "recycled" and released["reset_s"] >= 0
    assert not runtime.alive_processes()  # reuse kills every process
    assert sorted(p.name for p in runtime.workdir.iterdir()) == ["built", "lib"]
    assert (runtime.workdir / "lib" / "setup.txt").read_text() == "from the recipe"

    again = pool.take(SPEC, "c" * 32 + "-2")
    assert again is not None and again.runtime.runtime_id == runtime_id
    assert _recipe_runs(pool, runtime_id) == 1  # once per runtime, not per rollout
    assert pool.taken_by("c" * 32 + "-2") == runtime_id
    assert pool.release(again.runtime, "c" * 32 + "-2", reuse=False)["action"] == "destroyed"
    assert not (pool.root / runtime_id).exists() and pool.markers() == []


def test_a_retried_take_gets_the_runtime_it_already_holds(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "rt")
    pool.fill_one(SPEC)
    pool.fill_one(SPEC)
    first = pool.take(SPEC, "d" * 32 + "-1")
    second = pool.take(SPEC, "d" * 32 + "-1")
    assert first is not None and second is not None
    assert first.runtime.runtime_id == second.runtime.runtime_id
    assert pool.census().counts == {"taken": 1, "idle": 1}
    pool.reap_idle(-1)
    pool.release(first.runtime, "d" * 32 + "-1", reuse=False)
    assert pool.markers() == []


def test_a_dead_runtime_is_destroyed_on_take_and_the_next_one_taken(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "rt")
    dead = pool.fill_one(SPEC)
    time.sleep(0.02)  # the dead one is the oldest: taken first
    healthy = pool.fill_one(SPEC)
    (pool.root / dead / "workspace").rename(pool.root / dead / "gone")  # its sandbox broke

    got = pool.take(SPEC, "e" * 32 + "-1")
    assert got is not None and got.runtime.runtime_id == healthy
    assert got.detail["discarded_dead"] == 1
    assert not (pool.root / dead).exists()
    assert [m.runtime_id for m in pool.markers()] == [healthy]
    pool.release(got.runtime, "e" * 32 + "-1", reuse=False)


def test_cold_start_is_pooled_and_a_failing_recipe_leaves_nothing(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "rt")
    got = pool.cold(SPEC, "f" * 32 + "-1", 30)
    assert got.detail["source"] == "cold" and got.detail["recipe_s"] > 0
    assert pool.release(got.runtime, "f" * 32 + "-1", reuse=True)["action"] == "recycled"
    assert pool.census().idle_by_key == {pool_key(SPEC): 1}
    bad = spec_of({"kind": "local", "prepare": {"commands": ["exit 3"]}})
    with pytest.raises(RuntimeError, match="exit 3"):
        pool.cold(bad, "f" * 32 + "-2", 30)
    with pytest.raises(RuntimeError, match="exit 3"):
        pool.fill_one(bad)
    assert [m.state for m in pool.markers()] == ["idle"]
    assert sorted(p.name for p in pool.root.iterdir()) == [".warm", got.runtime.runtime_id]
    pool.reap_idle(-1)
    assert sorted(p.name for p in pool.root.iterdir()) == [".warm"]


def test_size_is_bounded(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "rt", max_runtimes=2)
    owners = [f"{i:032x}-1" for i in range(3)]
    taken = [pool.cold(SPEC, owner, 30) for owner in owners]  # cold starts are never refused
    actions = [
        pool.release(t.runtime, o, reuse=True)["action"] for t, o in zip(taken, owners, strict=True)
    ]
    assert actions == ["destroyed", "recycled", "recycled"]  # 3 > 2, then within the bound
    assert pool.census().total == 2
    for _ in range(3):
        pool.fill_one(SPEC)
    assert pool.reap_idle(600.0) and pool.census().total == 2  # over the bound: oldest go
    assert pool.reap_idle(600.0, keep={pool_key(SPEC): 2}) == []
    assert len(pool.reap_idle(-1, keep={pool_key(SPEC): 1})) == 1  # expired, one spared
    pool.reap_idle(-1)
    assert pool.census().total == 0


def _taker(root: str, spec: RuntimeSpec, owner: str, out: Any, start: Any) -> None:
    pool = WarmPool(Path(root))
    got: list[str] = []
    start.wait(30)  # all at once: they go for the same oldest runtimes
    while True:
        acquired = pool.take(spec, owner)
        if acquired is None:
            break
        got.append(acquired.runtime.runtime_id)
        os.rename(  # mark it handed on, so this taker can take another one
            pool.base / "taken" / f"{acquired.runtime.runtime_id}@{owner}",
            pool.base / "taken" / f"{acquired.runtime.runtime_id}@done-{owner}",
        )
    out.put((owner, got))


def test_concurrent_takers_in_separate_processes_never_share_a_runtime(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "rt")
    spec = RuntimeSpec(kind="local")
    made = {pool.fill_one(spec) for _ in range(60)}
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start = ctx.Barrier(6)
    procs = [
        ctx.Process(target=_taker, args=(str(pool.root), spec, f"{i:032x}-1", out, start))
        for i in range(6)
    ]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(30)
    claimed = [rid for got in results.values() for rid in got]
    assert sorted(claimed) == sorted(made)  # each runtime exactly once
    assert sum(1 for got in results.values() if got) >= 2  # they really raced
    for runtime_id in made:
        LocalRuntime(runtime_id, pool.root).stop()


@pytest.mark.parametrize("kind", ["bwrap", "docker"])
def test_sandboxed_kinds_recycle_and_detect_death(kind: str, tmp_path: Path) -> None:
    reason = skip_reason(kind)
    if reason:
        pytest.skip(reason)
    raw: dict[str, Any] = {"kind": kind, "prepare": {"commands": ["echo ready > ready.txt"]}}
    if kind == "docker":
        raw["image"] = TEST_IMAGE
    spec = spec_of(raw)
    pool = WarmPool(tmp_path / "rt")
    runtime_id = pool.fill_one(spec)
    got = pool.take(spec, "1" * 32 + "-1")
    assert got is not None and got.runtime.runtime_id == runtime_id
    got.runtime.exec("echo x > dirt.txt")
    assert pool.release(got.runtime, "1" * 32 + "-1", reuse=True)["action"] == "recycled"
    assert sorted(p.name for p in got.runtime.workdir.iterdir()) == ["ready.txt"]
    if kind == "docker":
        container = got.runtime.container()  # type: ignore[attr-defined]
        container.kill(signal.SIGKILL)
        assert pool.take(spec, "2" * 32 + "-1") is None  # dead container: destroyed on take
        assert got.runtime.container() is None  # type: ignore[attr-defined]
    pool.reap_idle(-1)
    assert not (pool.root / runtime_id).exists() and pool.markers() == []


def test_binds_are_part_of_the_pooled_sandbox(tmp_path: Path) -> None:
    """A bwrap runtime built with extra read-only binds (a preset's install) is only taken by a
    rollout asking for the same binds, and starts with them recorded."""
    reason = skip_reason("bwrap")
    if reason:
        pytest.skip(reason)
    install = tmp_path / "harnesses" / "aider" / "1.0"
    install.mkdir(parents=True)
    (install / "marker").write_text("installed")
    spec, binds = RuntimeSpec(kind="bwrap"), (str(install),)
    pool = WarmPool(tmp_path / "rt")
    runtime_id = pool.fill_one(spec, 30, binds)
    assert pool.take(spec, "1" * 32 + "-1") is None  # no binds: another sandbox
    got = pool.take(spec, "1" * 32 + "-1", binds)
    assert got is not None and got.runtime.runtime_id == runtime_id
    seen = got.runtime.exec(f"cat {install}/marker", timeout=10)
    assert seen.stdout_tail.strip() == "installed"
    pool.release(got.runtime, "1" * 32 + "-1", reuse=False)
