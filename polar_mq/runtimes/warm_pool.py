"""The warm pool of one node: prepared runtimes kept ready, claimed atomically by one prepare each.

Stages run in separate worker processes, so the pool is node state kept in the runtime root, not
in any process: one marker file per pooled runtime under `<root>/.warm/` (a name no runtime id can
take), and every change of hands is an atomic `rename(2)` of that marker, so exactly one of any
number of concurrent processes wins it. No database round trip is needed to take a runtime; the
database still decides who may keep one (the janitor checks the owning rollout).

    busy/<id>@<pid>-<start>       being built or recycled by that process
    idle/<id>                     ready; its mtime is when it became idle
    taken/<id>@<rollout>-<attempt> in use by that rollout attempt (set at take time, before the
                                  rollout row knows its runtime id)
    doomed/<id>@<pid>-<start>     being destroyed by that process

A marker is created before its runtime exists and removed after the runtime is gone, so a pooled
runtime present on the node without any marker is owned by nobody (a crash between the two).

Pooled runtime ids are `warm-<key>-<random>`, where `key` is a hash of the runtime spec parts that
define the sandbox (kind, image, network, limits, the prepare recipe); two jobs with the same
sandbox share runtimes. They never match the janitor's `<rollout hex>-<attempt>` pattern.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from polar_mq.runtimes.base import Runtime
from polar_mq.runtimes.options import runtime_from_spec
from polar_mq.runtimes.recipe import apply_recipe, restore_baseline, save_baseline
from polar_mq.spec.model import RuntimeSpec

log = logging.getLogger(__name__)

POOL_DIR = ".warm"
STATES = ("busy", "idle", "taken", "doomed")
POOLED_ID = re.compile(r"^warm-([0-9a-f]{12})-([0-9a-f]{12})$")


def pool_key(runtime_spec: RuntimeSpec, ro_binds: Sequence[str] = ()) -> str:
    """12 hex digits naming the sandbox a spec asks for; `warm`/`reuse` do not change it.

    `ro_binds` (a bwrap sandbox's view of a preset's install) are part of the sandbox: a runtime
    started without them cannot run that preset. The hashed parts and their names are those of
    the stored spec, and stay as they are: a node's idle runtimes keep their keys across a
    release."""
    recipe = runtime_spec.prepare
    parts: dict[str, Any] = {
        "kind": runtime_spec.kind,
        "image": runtime_spec.image,
        "network": runtime_spec.network,
        "memory_mb": runtime_spec.memory_mb,
        "cpu_seconds": runtime_spec.cpu_seconds,
        "max_open_files": runtime_spec.max_open_files,
        "cpus": runtime_spec.cpus,
        "pids": runtime_spec.pids,
        "prepare": {"files": dict(sorted(recipe.files.items())), "commands": list(recipe.commands)},
    }
    if ro_binds:  # absent without binds: the keys of before binds were hashed
        parts["ro"] = list(ro_binds)
    blob = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:12]


def is_pooled(runtime_id: str | None) -> bool:
    return bool(runtime_id) and POOLED_ID.match(str(runtime_id)) is not None


def process_tag(pid: int | None = None) -> str:
    """`<pid>-<start time>`: names a process, and is not fooled by a reused pid."""
    proc = psutil.Process(pid or os.getpid())
    return f"{proc.pid}-{int(proc.create_time() * 100)}"


def process_alive(tag: str) -> bool:
    pid = tag.partition("-")[0]
    try:
        proc = psutil.Process(int(pid))
        return f"{proc.pid}-{int(proc.create_time() * 100)}" == tag and proc.is_running()
    except (psutil.Error, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class Marker:
    state: str
    runtime_id: str
    owner: str
    """`<pid>-<start>` for busy/doomed, `<rollout hex>-<attempt>` for taken, "" for idle."""
    path: Path

    @property
    def key(self) -> str:
        match = POOLED_ID.match(self.runtime_id)
        return match.group(1) if match else ""


@dataclass
class Acquired:
    """A runtime for one rollout and how it was obtained (the prepare event's `runtime` detail)."""

    runtime: Runtime
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Census:
    """Markers by state, and idle runtimes by pool key."""

    counts: Counter[str] = field(default_factory=Counter)
    idle_by_key: Counter[str] = field(default_factory=Counter)
    busy_by_key: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class WarmPool:
    """One node's pool of warm runtimes under `root`; any process may build one and use it.

    `max_runtimes` bounds the pooled runtimes the node keeps (idle, building, in use): the refiller
    builds none past it and a used runtime is destroyed instead of recycled while the node is over
    it. A cold start for an empty pool is never refused (prepare must always get a runtime).
    """

    def __init__(self, root: Path, max_runtimes: int = 16) -> None:
        self.root = Path(root)
        self.base = self.root / POOL_DIR
        self.max_runtimes = max_runtimes

    # -- markers ---------------------------------------------------------------------------------

    def _dir(self, state: str) -> Path:
        path = self.base / state
        path.mkdir(parents=True, exist_ok=True)
        return path

    def markers(self, state: str | None = None) -> list[Marker]:
        found: list[Marker] = []
        for name in (state,) if state else STATES:
            directory = self.base / name
            with contextlib.suppress(FileNotFoundError):
                for entry in os.listdir(directory):
                    runtime_id, _, owner = entry.partition("@")
                    if POOLED_ID.match(runtime_id):
                        found.append(Marker(name, runtime_id, owner, directory / entry))
        return found

    def _create(self, state: str, runtime_id: str, owner: str) -> Path:
        path = self._dir(state) / (f"{runtime_id}@{owner}" if owner else runtime_id)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return path

    def _move(self, marker_path: Path, state: str, owner: str) -> Path | None:
        """Atomically hand a runtime over; None when another process moved it first."""
        runtime_id = marker_path.name.partition("@")[0]
        target = self._dir(state) / (f"{runtime_id}@{owner}" if owner else runtime_id)
        try:
            os.rename(marker_path, target)
        except FileNotFoundError:
            return None
        if state == "idle":
            os.utime(target)  # idle since now
        return target

    def census(self) -> Census:
        census = Census()
        for marker in self.markers():
            census.counts[marker.state] += 1
            if marker.state == "idle":
                census.idle_by_key[marker.key] += 1
            elif marker.state == "busy":
                census.busy_by_key[marker.key] += 1
        return census

    # -- building --------------------------------------------------------------------------------

    def new_id(self, key: str) -> str:
        return f"warm-{key}-{uuid.uuid4().hex[:12]}"

    def handle(
        self, runtime_spec: RuntimeSpec, runtime_id: str, ro_binds: Sequence[str] = ()
    ) -> Runtime:
        return runtime_from_spec(runtime_spec, runtime_id, self.root, ro_binds)

    def _build(self, runtime: Runtime, spec: RuntimeSpec, timeout_s: float) -> dict[str, Any]:
        """Start the runtime and apply its recipe; the baseline is what a recycle restores."""
        t0 = time.monotonic()
        runtime.start()
        t1 = time.monotonic()
        recipe_s = apply_recipe(runtime, spec.prepare, timeout_s)
        save_baseline(runtime)
        return {"start_s": round(t1 - t0, 4), "recipe_s": round(recipe_s, 4)}

    def fill_one(
        self, runtime_spec: RuntimeSpec, timeout_s: float = 300.0, ro_binds: Sequence[str] = ()
    ) -> str:
        """Build one idle runtime for `runtime_spec` (the refiller's unit of work); its id."""
        runtime_id = self.new_id(pool_key(runtime_spec, ro_binds))
        marker = self._create("busy", runtime_id, process_tag())
        runtime = self.handle(runtime_spec, runtime_id, ro_binds)
        try:
            self._build(runtime, runtime_spec, timeout_s)
        except BaseException:
            self._destroy(runtime, marker)
            raise
        if self._move(marker, "idle", "") is None:
            raise RuntimeError(f"warm runtime {runtime_id}: its marker vanished while building")
        return runtime_id

    # -- taking ----------------------------------------------------------------------------------

    def take(
        self, runtime_spec: RuntimeSpec, owner: str, ro_binds: Sequence[str] = ()
    ) -> Acquired | None:
        """Claim an idle runtime of this spec for `owner` (`<rollout hex>-<attempt>`), or None.

        Each candidate is claimed by renaming its marker (only one taker wins it), then checked
        (`alive`): a dead one (its container stopped, its directory was deleted) is destroyed and
        the next one is tried.
        """
        key = pool_key(runtime_spec, ro_binds)
        started = time.monotonic()
        discarded = 0
        held = self.taken_by(owner)  # a retried prepare keeps what its first try took
        candidates = [m for m in self.markers("taken") if m.runtime_id == held]
        idle = [m for m in self.markers("idle") if m.key == key]
        candidates += sorted(idle, key=lambda m: _mtime(m.path))  # oldest first
        for candidate in candidates:
            claimed: Path | None = candidate.path
            if candidate.state == "idle":
                claimed = self._move(candidate.path, "taken", owner)
            if claimed is None:
                continue  # another prepare won it
            runtime = self.handle(runtime_spec, candidate.runtime_id, ro_binds)
            check_started = time.monotonic()
            if self.alive(runtime):
                return Acquired(
                    runtime,
                    {
                        "source": "pool",
                        "warm": True,
                        "start_s": round(time.monotonic() - started, 4),
                        "liveness_s": round(time.monotonic() - check_started, 4),
                        "recipe_s": 0.0,
                        "discarded_dead": discarded,
                    },
                )
            log.warning("warm runtime %s is dead; destroying it", runtime.runtime_id)
            discarded += 1
            try:
                self._destroy(runtime, claimed)
            except Exception:  # the janitor finishes it; prepare goes on with the next one
                log.exception("destroying dead warm runtime %s failed", runtime.runtime_id)
        return None

    def alive(self, runtime: Runtime) -> bool:
        """Whether a pooled runtime can still run commands, from its state (no exec: fast).

        What can die differs by kind: `local` and `bwrap` start a fresh process (namespace) per
        exec, so they live as long as their directories (and, with a pids limit, their cgroup);
        a `docker` runtime lives as long as its container runs.
        """
        try:
            if not runtime.workdir.is_dir():
                return False
            container = getattr(runtime, "container", None)
            if callable(container):
                found = container()
                return found is not None and found.status == "running"
            cgroup = getattr(runtime, "cgroup", None)
            if getattr(runtime, "pids_limit", None) is not None and cgroup is not None:
                return bool((cgroup / "cgroup.procs").exists())
            return True
        except Exception:
            return False

    def cold(
        self,
        runtime_spec: RuntimeSpec,
        owner: str,
        timeout_s: float,
        ro_binds: Sequence[str] = (),
    ) -> Acquired:
        """A new pooled runtime built for `owner` now (the pool was empty): recyclable later."""
        runtime_id = self.new_id(pool_key(runtime_spec, ro_binds))
        marker = self._create("taken", runtime_id, owner)
        runtime = self.handle(runtime_spec, runtime_id, ro_binds)
        try:
            timings = self._build(runtime, runtime_spec, timeout_s)
        except BaseException:
            self._destroy(runtime, marker)
            raise
        return Acquired(runtime, {"source": "cold", "warm": False, **timings})

    def taken_by(self, owner: str) -> str | None:
        """The pooled runtime `owner` holds (prepare failed before recording it), if any."""
        for marker in self.markers("taken"):
            if marker.owner == owner:
                return marker.runtime_id
        return None

    # -- giving back -----------------------------------------------------------------------------

    def release(self, runtime: Runtime, owner: str, reuse: bool) -> dict[str, Any]:
        """Recycle (reset, restore the baseline, back to idle) or destroy a taken runtime.

        Recycled only when `reuse`, the node is within `max_runtimes` and the reset works; the
        marker moves to `busy` first so the janitor never judges a runtime mid-recycle by the
        rollout that just finished with it. Returns the timings for the rollout's events.
        """
        path = self._dir("taken") / f"{runtime.runtime_id}@{owner}"
        busy = self._move(path, "busy", process_tag())
        if busy is None:  # not ours any more (the janitor or another release took it)
            return {"runtime_id": runtime.runtime_id, "action": "none"}
        started = time.monotonic()
        if reuse and self.census().total <= self.max_runtimes:
            try:
                runtime.reset()
                restore_baseline(runtime)
                if self._move(busy, "idle", "") is not None:
                    return {
                        "runtime_id": runtime.runtime_id,
                        "action": "recycled",
                        "reset_s": round(time.monotonic() - started, 4),
                    }
            except Exception:
                log.exception("recycling warm runtime %s failed; destroying it", runtime.runtime_id)
        self._destroy(runtime, busy)
        return {
            "runtime_id": runtime.runtime_id,
            "action": "destroyed",
            "teardown_s": round(time.monotonic() - started, 4),
        }

    def _destroy(self, runtime: Runtime, marker: Path | None) -> None:
        """Stop the runtime, then drop its marker (never the other way round: see the module)."""
        doomed = self._move(marker, "doomed", process_tag()) if marker is not None else None
        try:
            runtime.stop()
        finally:
            for path in (doomed, marker):
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

    def destroy_marked(self, marker: Marker, kind: str | None = None) -> bool:
        """Claim `marker` for destruction (rename) and destroy its runtime; False if it moved.

        `kind`: the runtime's kind when known (a docker runtime whose directory is already gone
        is only found by its container); else the one its directory records.
        """
        doomed = self._move(marker.path, "doomed", process_tag())
        if doomed is None:
            return False
        from polar_mq.runtimes.janitor import remove_runtime

        try:
            remove_runtime(marker.runtime_id, self.root, kind)
        finally:
            with contextlib.suppress(FileNotFoundError):
                doomed.unlink()
        return True

    def reap_idle(self, idle_ttl_s: float, keep: Mapping[str, int] | None = None) -> list[str]:
        """Destroy idle runtimes idle longer than `idle_ttl_s`, and the oldest idle ones while the
        node holds more than `max_runtimes`; `keep` is per key how many idle ones to spare."""
        now = time.time()
        idle = sorted(self.markers("idle"), key=lambda m: _mtime(m.path))
        over = self.census().total - self.max_runtimes
        spared: Counter[str] = Counter(keep or {})
        removed = []
        for marker in idle:
            expired = now - _mtime(marker.path) > idle_ttl_s
            if not expired and over <= 0:
                continue
            if expired and over <= 0 and spared[marker.key] > 0:
                spared[marker.key] -= 1
                continue
            try:
                if self.destroy_marked(marker):
                    removed.append(marker.runtime_id)
                    over -= 1
            except Exception:
                log.exception("destroying idle warm runtime %s failed", marker.runtime_id)
        return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
