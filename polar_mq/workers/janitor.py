"""The node janitor: removes runtimes on this node that no rollout needs any more.

A runtime is needed only while its rollout is unfinished *and* still on the attempt the runtime was
made for (runtime ids are `<rollout hex>-<attempt>`). Everything else found on the node is an
orphan: the leftovers of a worker killed with -9 (its agent keeps running in its own session), of a
rollout cancelled between stages, or of an attempt the sweeper restarted elsewhere. The janitor
runs once when a node's workers start and then every few seconds, and kills and deletes orphans;
the database decides, so a janitor never touches a runtime a live stage is using.

Warm-pool runtimes (`warm-<key>-<random>`, see `polar_mq/runtimes/warm_pool.py`) are judged by
their pool marker instead: idle ones are kept (they are the node's, not a rollout's, and the pool
reaps them itself); taken ones live exactly as long as the rollout attempt that took them (the
marker names it, so one taken a moment ago by a prepare that has not committed yet is safe);
ones being built, recycled or destroyed live as long as the process doing it. A pooled runtime
with no marker is owned by nobody, but a marker can be missed while it is being renamed between
two states, so it is removed only when it has no marker in two consecutive sweeps.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.runtimes.janitor import present_runtimes, remove_runtime
from polar_mq.runtimes.local import RUNTIME_TAG
from polar_mq.runtimes.warm_pool import POOLED_ID, Marker, WarmPool, is_pooled, process_alive

log = logging.getLogger(__name__)

_RUNTIME_ID = re.compile(r"^([0-9a-f]{32})-(\d+)(?:-eval)?$")  # -eval: grading runtime


def local_runtime_ids(root: Path) -> set[str]:
    """Runtime ids present on this node: directories under `root` and tagged live processes."""
    ours = (_RUNTIME_ID, POOLED_ID)
    found = (
        {p.name for p in root.iterdir() if any(r.match(p.name) for r in ours)}
        if root.is_dir()
        else set()
    )
    needle = f"{RUNTIME_TAG}=".encode()
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(needle):
                value = entry[len(needle) :].decode(errors="replace")
                # Only runtimes of this root: another deployment on the host is not ours to judge.
                home = f"HOME={root / value}/".encode()
                if (_RUNTIME_ID.match(value) or POOLED_ID.match(value)) and home in environ:
                    found.add(value)
    return found


def orphans(session: Session, runtime_ids: set[str]) -> set[str]:
    """The ids in `runtime_ids` whose rollout is finished, unknown, or on another attempt."""
    parsed: dict[str, tuple[uuid.UUID, int]] = {}
    for runtime_id in runtime_ids:
        match = _RUNTIME_ID.match(runtime_id)
        if match:
            parsed[runtime_id] = (uuid.UUID(match.group(1)), int(match.group(2)))
    if not parsed:
        return set()
    rows = session.execute(
        select(Rollout.id, Rollout.attempt, Rollout.status).where(
            Rollout.id.in_({rid for rid, _ in parsed.values()})
        )
    ).all()
    current = {row.id: row.attempt for row in rows if row.status not in RolloutStatus.TERMINAL}
    return {rt for rt, (rid, attempt) in parsed.items() if current.get(rid) != attempt}


class NodeJanitor:
    """Finds and removes orphan runtimes of one node, of every kind (directories, processes,
    containers, cgroups: `polar_mq.runtimes.janitor` lists and removes them by root)."""

    def __init__(
        self,
        root: Path,
        factory: sessionmaker[Session],
        remove: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.factory = factory
        self._kinds: dict[str, str] = {}
        self.remove = remove or self._remove
        self.pool = WarmPool(self.root)
        self._unmarked: set[str] = set()

    def _remove(self, runtime_id: str) -> None:
        remove_runtime(runtime_id, self.root, self._kinds.get(runtime_id))

    def sweep_once(self) -> list[str]:
        self._kinds = present_runtimes(self.root)
        present = local_runtime_ids(self.root) | set(self._kinds)
        markers = self.pool.markers()
        if not present and not markers:
            return []
        owners = {m.owner for m in markers if m.state == "taken"}
        with self.factory() as session:
            doomed = sorted(orphans(session, {r for r in present if not is_pooled(r)}))
            gone_owners = orphans(session, owners)
        removed = []
        for runtime_id in doomed:
            try:
                self.remove(runtime_id)
                removed.append(runtime_id)
            except Exception:
                log.exception("janitor: removing runtime %s failed", runtime_id)
        removed += self._sweep_pooled({r for r in present if is_pooled(r)}, markers, gone_owners)
        if removed:
            log.warning("janitor removed %d orphan runtime(s): %s", len(removed), removed)
        return removed

    def _sweep_pooled(
        self, present: set[str], markers: list[Marker], gone_owners: set[str]
    ) -> list[str]:
        """Remove pooled runtimes nobody owns; idle ones and those in use are kept."""
        removed = []
        marked = {m.runtime_id for m in markers}
        for marker in markers:
            if marker.state == "idle":
                continue
            if marker.state == "taken":
                dead = marker.owner in gone_owners
            else:  # busy or doomed: the process doing it must still be alive
                dead = not process_alive(marker.owner)
            if dead and self._destroy(
                marker.runtime_id,
                partial(self.pool.destroy_marked, marker, self._kinds.get(marker.runtime_id)),
            ):
                removed.append(marker.runtime_id)
        unmarked = present - marked
        for runtime_id in sorted(unmarked & self._unmarked):
            if self._destroy(runtime_id, partial(self._remove_unmarked, runtime_id)):
                removed.append(runtime_id)
        self._unmarked = unmarked - set(removed)
        return removed

    def _remove_unmarked(self, runtime_id: str) -> bool:
        self.remove(runtime_id)
        return True

    @staticmethod
    def _destroy(runtime_id: str, action: Callable[[], bool]) -> bool:
        try:
            return bool(action())
        except Exception:
            log.exception("janitor: removing pooled runtime %s failed", runtime_id)
            return False

    def run_forever(self, stop: threading.Event, interval_s: float) -> None:
        while not stop.is_set():
            try:
                self.sweep_once()
            except Exception:
                log.exception("janitor sweep failed")
            stop.wait(interval_s)


def start_node_janitor(settings: Settings, interval_s: float = 5.0) -> threading.Event:
    """Sweep once now (orphans of a previous run), then keep sweeping in a daemon thread.

    Returns the event that stops the thread.
    """
    from polar_mq.infra.db import create_db_engine, make_session_factory

    factory = make_session_factory(create_db_engine(settings.database_url, pool_size=1))
    janitor = NodeJanitor(settings.runtime_root, factory)
    stop = threading.Event()
    threading.Thread(
        target=janitor.run_forever, args=(stop, interval_s), name="polar-janitor", daemon=True
    ).start()
    return stop
