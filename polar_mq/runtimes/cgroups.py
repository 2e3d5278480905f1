"""A `pids` control group per sandbox: a process limit that a forking agent cannot exceed or leave.

RLIMIT_NPROC cannot do this job: it counts every process of the user on the whole host and root
is exempt from it. A cgroup counts exactly the sandbox's processes, and its member list
(`cgroup.procs`) names every one of them, including processes that scrubbed their environment or
left their session, which is what `stop()` needs to be sure nothing is left.

Both hierarchies are handled: v1 (`/sys/fs/cgroup/pids/...`) and v2 (`/sys/fs/cgroup/...` with the
`pids` controller delegated to our subtree). Creating groups needs write access to the cgroup file
system (root, or a delegated subtree); without it the caller gets a clear error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
PARENT = "polar_mq"


class CgroupUnavailable(RuntimeError):
    """No writable pids controller on this node."""


def group_name(runtime_id: str, root: Path) -> str:
    """Unique per (root, id): two runtime roots on one node may reuse an id (tests do)."""
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:10]
    return f"{runtime_id}-{digest}"


def _base(fs: Path) -> Path:
    """Directory holding our groups: v1 under the pids controller, v2 under the unified root."""
    if (fs / "cgroup.controllers").exists():  # v2
        return fs / PARENT
    return fs / "pids" / PARENT


def group_path(name: str, fs: Path = CGROUP_FS) -> Path:
    return _base(fs) / name


def create(name: str, pids_max: int, fs: Path = CGROUP_FS) -> Path:
    """Create (or update) the group with `pids.max`; return its directory."""
    base = _base(fs)
    try:
        if base.parent == fs:  # v2: the controller must be enabled on the way down
            _enable_pids(fs)
            base.mkdir(exist_ok=True)
            _enable_pids(base)
        elif not base.parent.is_dir():
            raise CgroupUnavailable(f"no cgroup v1 pids controller at {base.parent}")
        path = base / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "pids.max").write_text(str(pids_max))
    except OSError as exc:
        raise CgroupUnavailable(
            f"cannot create a pids cgroup under {base} ({exc.strerror or exc}); a pids limit "
            "needs write access to the cgroup file system (run the worker as root or delegate "
            "a subtree)"
        ) from exc
    return path


def _enable_pids(group: Path) -> None:
    control = group / "cgroup.subtree_control"
    if "pids" not in control.read_text().split():
        control.write_text("+pids")


def members(path: Path) -> list[int]:
    """Pids currently in the group (empty when the group does not exist)."""
    try:
        text = (path / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(line) for line in text.split()]


def remove(path: Path, timeout: float = 5.0) -> None:
    """Remove an empty group; killed members may take a moment to leave it."""
    end = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= end:
                raise
            time.sleep(0.02)


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        remove(path, timeout=0)
