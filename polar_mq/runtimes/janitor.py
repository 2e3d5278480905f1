"""Find and remove the runtimes of one runtime root, whatever their kind.

A worker killed with -9 leaves its sandboxes behind: the directory under the runtime root, the
processes (local, bwrap), the container (docker), the pids cgroup (bwrap with a pids limit) and
the kill group (local).
Every one of those carries the runtime id and is tied to its root (directory path, container label,
cgroup name suffix), so this module can list them for one root without touching another
deployment's on the same host, and remove each with its own kind's `stop()`.

Which runtimes are still needed is not decided here: the caller passes the ids to keep (the worker
janitor asks the database, see `polar_mq/workers/janitor.py`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_mq.runtimes import cgroups, get_runtime, kill_group
from polar_mq.runtimes.base import validate_runtime_id

log = logging.getLogger(__name__)
_META_FILE = "runtime.json"
GRADING_DIR = "grading"
"""Below the runtime root: what the grader keeps of a rollout outside every workspace, one file
per kind named after its evaluation runtime's id (`polar_mq.swe.grading`); swept with it."""


@dataclass
class SweepReport:
    """What a sweep removed (by kind) and what it could not (id -> error)."""

    removed: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def present_runtimes(root: Path, docker_client: Any | None = None) -> dict[str, str]:
    """Runtime id -> kind for everything of `root` on this node (directories, containers, cgroups).

    `docker_client`: a docker SDK client; None uses the default one when an engine answers, and
    skips containers when none does (a node without docker has no containers to leak).
    """
    root = Path(root).resolve()
    found: dict[str, str] = {}
    found.update(_docker_runtimes(root, docker_client))
    for runtime_id in _cgroup_runtimes(root):
        found.setdefault(runtime_id, "bwrap")
    for runtime_id in _kill_group_runtimes(root):
        found.setdefault(runtime_id, "local")
    if root.is_dir():
        for entry in root.iterdir():
            recorded = _directory_kind(entry)
            if recorded is not None:
                found[entry.name] = recorded  # the directory's record wins
    return found


def remove_runtime(
    runtime_id: str, root: Path, kind: str | None = None, docker_client: Any | None = None
) -> None:
    """Kill and delete one runtime from any process; also its container or cgroup if present."""
    root = Path(root).resolve()
    kind = kind or _directory_kind(root / runtime_id) or "local"
    options: dict[str, Any] = {}
    if kind == "docker" and docker_client is not None:
        options["client"] = docker_client
    get_runtime(kind, runtime_id, root, None, **options).stop()


def sweep_orphans(
    root: Path,
    keep: Collection[str] | Callable[[str], bool] = (),
    *,
    docker_client: Any | None = None,
) -> SweepReport:
    """Remove every runtime of `root` whose id is not kept; never raises for one bad runtime.

    Call it at worker start with the ids of the runtimes this node's live rollouts still use.
    """
    wanted = keep if callable(keep) else set(keep).__contains__
    report = SweepReport()
    for runtime_id, kind in sorted(present_runtimes(root, docker_client).items()):
        if wanted(runtime_id):
            continue
        try:
            remove_runtime(runtime_id, root, kind, docker_client)
            report.removed[runtime_id] = kind
        except Exception as exc:  # one stuck runtime must not stop the sweep
            log.exception("janitor: removing %s runtime %s failed", kind, runtime_id)
            report.failed[runtime_id] = f"{type(exc).__name__}: {exc}"
    _sweep_grading_files(Path(root).resolve() / GRADING_DIR, wanted, report)
    if report.removed:
        log.warning("janitor removed %d orphan runtime(s): %s", len(report.removed), report.removed)
    return report


def _sweep_grading_files(folder: Path, wanted: Callable[[str], bool], report: SweepReport) -> None:
    """Remove the grader's saved files of runtimes no live rollout uses (a worker killed between
    saving a diff and releasing the runtime left them), and half-written ones."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        runtime_id = entry.name.partition(".")[0]
        if runtime_id and wanted(runtime_id):
            continue
        try:
            entry.unlink()
            report.removed[entry.name] = "grading"
        except FileNotFoundError:
            pass
        except OSError as exc:
            report.failed[entry.name] = f"{type(exc).__name__}: {exc}"


def _directory_kind(path: Path) -> str | None:
    """The kind recorded by `start()`; a directory killed before its record is `local`-shaped."""
    if not _valid_id(path.name) or not path.is_dir():
        return None
    try:
        meta = json.loads((path / _META_FILE).read_text())
    except (OSError, ValueError):
        return "local" if (path / "workspace").is_dir() else None
    kind = meta.get("kind") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) else "local"


def _docker_runtimes(root: Path, client: Any | None) -> dict[str, str]:
    try:
        from polar_mq.runtimes.docker import (
            LABEL_ROOT,
            LABEL_RUNTIME,
            default_client,
            docker_available,
        )
    except ImportError:  # the docker SDK is not installed: nothing can have made containers
        return {}
    if client is None:
        if docker_available() is not None:
            return {}
        client = default_client()
    containers = client.containers.list(all=True, filters={"label": f"{LABEL_ROOT}={root}"})
    found = {}
    for container in containers:
        runtime_id = container.labels.get(LABEL_RUNTIME, "")
        if _valid_id(runtime_id):
            found[runtime_id] = "docker"
    return found


def _cgroup_runtimes(root: Path) -> list[str]:
    """Ids of pids cgroups made for `root` (their names end with the root's digest)."""
    suffix = cgroups.group_name("x", root)[1:]  # "-<digest>"
    base = cgroups.group_path("x").parent
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = [p.name for p in base.iterdir() if p.is_dir()]
    return [n[: -len(suffix)] for n in names if n.endswith(suffix) and _valid_id(n[: -len(suffix)])]


def _kill_group_runtimes(root: Path) -> list[str]:
    """Ids of `local` kill groups made for `root` (a worker killed before the stop)."""
    group = kill_group.group_for("x", root)
    if group is None:
        return []
    suffix = group.name[1:]  # "-<digest>"
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = [p.name for p in group.parent.iterdir() if p.is_dir()]
    return [n[: -len(suffix)] for n in names if n.endswith(suffix) and _valid_id(n[: -len(suffix)])]


def _valid_id(runtime_id: str) -> bool:
    try:
        validate_runtime_id(runtime_id)
    except ValueError:
        return False
    return True
