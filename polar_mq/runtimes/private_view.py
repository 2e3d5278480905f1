"""What a `local` agent must not see of the node, and the wrapper that hides it (the worker side).

Under `local` the agent opens files by their node paths as an unprivileged pool user, so anything
world-readable is open to it: the checkout polar_mq runs from (with its `.env`, `.git`, tests), the
log directory, the other runtimes under the runtime root. Where the node allows it (the worker is
root and may create mount namespaces: `CAP_SYS_ADMIN`, checked once per process by a probe), each
agent command therefore starts through `mount_view.py`, which covers those paths with empty
read-only mounts in a mount namespace of its own before it drops to the agent's uid:

- hidden: the checkout (the repository holding the running `polar_mq` package, unless it is a
  site-packages install), `log_dir`, `agent_claims_dir`, the runtime root (a shared sticky
  directory such as `/tmp` itself is left alone), and `local_hidden_paths`;
- bound back (the agent's command needs them): its own runtime directory (writable), the
  worker's interpreter prefixes (the reference agent and `{python}` run with it; a venv inside
  the checkout stays visible, read-only), the `polar_mq` package (read-only, as under `bwrap`) and
  the harness installs (`harness_root`). A directory the agent may not enter above one of them
  (an interpreter in root's 0700 home) is covered as well, so the kept path becomes reachable and
  nothing else there;
- private (`PRIVATE_TMP`): `/tmp`, `/dev/shm` and `/var/tmp` become an empty writable tmpfs of
  the command's own, so nothing the agent writes there reaches the node (or the next holder of
  its pool uid); it is gone with the command's last process, as under `bwrap`. The agent's
  `TMPDIR` (its runtime's `tmp`) is what persists between its commands.

Paths are hidden, not inodes: a hard link or another mount of the same files elsewhere stays
visible. Where the node cannot (the worker is not root, no mount namespaces), commands run as
before and the node says once that agents can read the checkout; production refuses such a
`local` runtime unless `local_allow_shared_view` says the operator accepts it.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import polar_mq
from polar_mq.runtimes.identity import AgentIdentity, may_search, say_once

if TYPE_CHECKING:
    from polar_mq.config import Settings

log = logging.getLogger(__name__)

HELPER = Path(__file__).with_name("mount_view.py")
PRIVATE_TMP = ("/tmp", "/dev/shm", "/var/tmp")
_INSTALL_DIRS = ("site-packages", "dist-packages")


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """The paths one runtime's commands must not see, and those bound back for them."""

    hide: tuple[str, ...]
    keep: tuple[tuple[str, bool], ...]
    private: tuple[str, ...] = ()
    """Shared temporary directories replaced by a tmpfs of the command's own."""

    def argv(
        self, command: list[str], status_fd: int, agent: AgentIdentity, cwd: Path
    ) -> list[str]:
        """`command` started through the helper, which becomes `agent` once the view is built."""
        args = [sys.executable, "-I", "-S", str(HELPER), str(status_fd)]
        args += [str(agent.uid), str(agent.gid), str(cwd)]
        for path in self.hide:
            args += ["--hide", path]
        for path, writable in self.keep:
            args += ["--keep-rw" if writable else "--keep", path]
        for path in self.private:
            args += ["--private-tmp", path]
        return [*args, "--", *command]


def checkout_root() -> Path | None:
    """The repository the running `polar_mq` package comes from; None for an installed package."""
    package = Path(polar_mq.__file__).resolve().parent
    if any(part in _INSTALL_DIRS for part in package.parts):
        return None
    top = package.parent
    return top if (top / "pyproject.toml").exists() or (top / ".git").exists() else None


def plan_view(
    settings: Settings, runtime_root: Path, runtime_path: Path, agent: AgentIdentity
) -> ViewPlan:
    """Hide the node's private paths from the commands of the runtime at `runtime_path`."""
    keep = [(_real(runtime_path), True), *((path, False) for path in _shared_keeps(settings))]
    kept = {path for path, _ in keep}
    hide: list[str] = []
    for path in [*_wanted_hidden(settings, runtime_root), *_private_parents(kept, agent)]:
        real = _real(path)
        # never the whole tree, a kept path itself, or anything inside the agent's own directory
        if real == "/" or real in kept or Path(real).is_relative_to(keep[0][0]):
            continue
        if os.path.lexists(real) and real not in hide:
            hide.append(real)
    private = [
        real
        for real in dict.fromkeys(map(_real, PRIVATE_TMP))
        if os.path.isdir(real) and real != "/" and real not in kept and real not in hide
    ]
    return ViewPlan(tuple(hide), tuple(dict.fromkeys(keep)), tuple(private))


def _shared_keeps(settings: Settings) -> list[str]:
    """What every agent command may need, bound back read-only: the interpreter, the package,
    the harness installs."""
    package = Path(polar_mq.__file__).parent
    return [_real(path) for path in (sys.prefix, sys.base_prefix, package, settings.harness_root)]


def reachable_in_view(path: Path, agent: AgentIdentity, settings: Settings) -> bool:
    """Whether the view makes `path` reachable to `agent` though a private directory above it
    blocks the way on the node (`_private_parents`): it lies in a kept path, searchable from
    there down."""
    if unavailable_reason() is not None:
        return False
    real = Path(_real(path))
    for kept in map(Path, _shared_keeps(settings)):
        if real == kept or real.is_relative_to(kept):
            below = [real, *real.relative_to(kept).parents]
            try:
                return all(may_search((kept / part).stat(), agent) for part in below)
            except OSError:
                return False
    return False


def _wanted_hidden(settings: Settings, runtime_root: Path) -> Iterator[Path]:
    checkout = checkout_root()
    if checkout is not None:
        yield checkout
    if settings.log_dir is not None:
        yield settings.log_dir
    yield settings.agent_claims_dir
    if not _shared_sticky(runtime_root):
        yield runtime_root
    yield from settings.local_hidden_paths


def _private_parents(kept: set[str], agent: AgentIdentity) -> Iterator[Path]:
    """The directories the agent may not enter above a kept path (an interpreter below root's
    0700 home): covered too, so that the kept path is reachable and nothing else there."""
    for path in kept:
        for parent in reversed(Path(path).parents):
            try:
                info = parent.stat()
            except OSError:
                break
            if str(parent) != "/" and not may_search(info, agent):
                yield parent
                break


def _shared_sticky(path: Path) -> bool:
    """A directory such as /tmp: covering it would take away every user's temporary files."""
    try:
        return bool(path.stat().st_mode & stat.S_ISVTX)
    except OSError:
        return False


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.abspath(path))


@lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when this node can build the view, else why not (probed once per process)."""
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux only"
    if os.geteuid() != 0:
        return "the worker is not root"
    directory = tempfile.mkdtemp(prefix="polar-mq-view-probe-")
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(HELPER), "--probe", directory],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the mount namespace probe did not run: {exc}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        return f"no mount namespace here ({detail[-1] if detail else done.returncode})"
    return None


def shared_view_message(reason: str) -> str:
    return (
        f"agents under the local runtime can read the checkout, the log directory and every "
        f"world-readable file of this node: no private mount view ({reason}); use the bwrap or "
        "docker runtime for agents you do not trust (or run the worker as root with "
        "CAP_SYS_ADMIN)"
    )


def require_view(settings: Settings) -> None:
    """At a switching `local` runtime's start: refused in production without the view (unless
    `local_allow_shared_view`), said once otherwise."""
    reason = unavailable_reason()
    if reason is None:
        return
    message = shared_view_message(reason)
    if settings.is_production and not settings.local_allow_shared_view:
        raise RuntimeError(
            f"{message}; production refuses it: use bwrap or docker, or set "
            "POLAR_MQ_LOCAL_ALLOW_SHARED_VIEW=1 to accept it"
        )
    say_once(message)


def report_node(settings: Settings) -> None:
    """Once at a worker node's start: what `local` agents will not see, or that they see all."""
    reason = unavailable_reason()
    if reason is None:
        root = settings.runtime_root
        plan = plan_view(settings, root, root / "<runtime>", AgentIdentity(-1, -1, "agent"))
        log.info("local agents run in a private mount view hiding %s", ", ".join(plan.hide))
    else:
        say_once(shared_view_message(reason))
