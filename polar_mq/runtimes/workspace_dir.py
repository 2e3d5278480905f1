"""The node-side directory every runtime kind keeps: `root/<runtime_id>/` and its record.

`local`, `bwrap` and `docker` are siblings that each compose one `RuntimeDir`: the agent's
`workspace`, `home` and `tmp` directories, the `runtime.json` record (kind, limits, the identity
commands run as) that lets any later handle, in any worker process, act as the one that started
the runtime, and the file moves (`upload`, `download`) that never follow a link the agent planted
(`safe_files`). Only how commands run differs between the kinds.

Identity choice: under `local` commands reach files by their node paths, so the runtime takes a
pool user of its own (`agent_pool`) and refuses a workspace that user cannot reach (production)
or falls back to the worker's identity (development, `POLAR_MQ_UNSAFE_ROOT_AGENTS`). `bwrap` and
`docker` mount the directories themselves and run as the given or the node's agent identity.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar_mq.runtimes import identity, safe_files
from polar_mq.runtimes.agent_pool import POOL_PREFIX, AgentPool
from polar_mq.runtimes.base import ResourceLimits, Runtime
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.process_kit import atomic_write

if TYPE_CHECKING:
    from polar_mq.config import Settings

META_FILE = "runtime.json"
# Worker variables an ordinary program needs; everything else (database URLs, secrets) stays out.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "SSL_CERT_FILE")


class RuntimeDir:
    """A runtime's directory on the node, its record and the agent's files in it.

    `owner_only_dirs`: agent directories 0700, because under `local` only the uid separates
    rollouts (`bwrap` builds its sandbox as a capability-less root that must still enter them;
    its mounts separate rollouts). `pooled`: choose the identity the `local` way (module docstring).
    """

    def __init__(
        self,
        runtime_id: str,
        root: Path,
        kind: str,
        limits: ResourceLimits | None = None,
        agent: AgentIdentity | None = None,
        *,
        owner_only_dirs: bool,
        pooled: bool,
    ) -> None:
        self.runtime_id = runtime_id
        self.root = Path(root)
        self.path = self.root / runtime_id
        self.kind = kind
        self.given_limits = limits
        self.given_agent = agent
        self.owner_only_dirs = owner_only_dirs
        self.pooled = pooled
        self._record: dict[str, Any] | None = None
        """`runtime.json` as this handle wrote or first read it (see `meta`)."""

    @property
    def workdir(self) -> Path:
        return self.path / "workspace"

    @property
    def agent_dirs(self) -> tuple[Path, ...]:
        """The directories the agent owns: workspace, home and tmp."""
        return (self.workdir, self.path / "home", self.path / "tmp")

    def meta(self) -> dict[str, Any]:
        """The `runtime.json` record, empty when there is none (not started, or removed).

        Read once per handle: only `create` writes it, once per runtime (the identity it records
        must never change under a running command), and this handle forgets it when it removes
        the runtime. A stage asks for the identity or the limits several times (start, upload,
        exec, stop); each read was a file open, read and JSON parse."""
        if self._record is not None:
            return self._record
        try:
            meta = json.loads((self.path / META_FILE).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(meta, dict):
            return {}
        self._record = meta
        return meta

    @property
    def limits(self) -> ResourceLimits | None:
        """Limits given to this handle, else those recorded by whoever started the runtime."""
        if self.given_limits is not None:
            return self.given_limits
        recorded = self.meta().get("limits")
        return ResourceLimits(**recorded) if recorded else None

    @property
    def agent(self) -> AgentIdentity:
        """Who commands run as: recorded at `start()`, so every later handle agrees with it."""
        recorded = self.meta().get("agent")
        if isinstance(recorded, dict):
            return AgentIdentity(int(recorded["uid"]), int(recorded["gid"]), str(recorded["name"]))
        return self.given_agent or identity.node_identity()

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self) -> None:
        """Make the directories and the record (kept when it exists and no limits are given)."""
        for directory in self.agent_dirs:
            directory.mkdir(parents=True, exist_ok=True)
        meta_path = self.path / META_FILE
        if self.given_limits is not None or not meta_path.exists():
            limits = self.given_limits
            meta = {
                "kind": self.kind,
                "runtime_id": self.runtime_id,
                "limits": None if limits is None else _limits_dict(limits),
                "agent": self.choose_agent().as_dict(),
            }
            atomic_write(meta_path, json.dumps(meta).encode())
            self._record = meta
        self.give_dirs()

    def choose_agent(self) -> AgentIdentity:
        """The identity this runtime will run commands as (see the module docstring)."""
        if not self.pooled:
            return self.given_agent or identity.node_identity()
        agent = self.given_agent or self._pool_agent() or identity.node_identity()
        if not agent.switch or identity.can_reach(self.workdir, agent):
            return agent
        self.release_agent(agent)
        message = (
            f"runtime root {self.root} is not reachable by the agent user {agent.name} (uid "
            f"{agent.uid}): a parent directory is private; put POLAR_MQ_RUNTIME_ROOT below "
            "directories every user may enter (e.g. /tmp/polar_mq/runtimes)"
        )
        settings = _settings()
        if settings.is_production or not settings.unsafe_root_agents:
            raise RuntimeError(message)
        identity.say_once(f"{message}; POLAR_MQ_UNSAFE_ROOT_AGENTS: agents there run as the worker")
        return identity.worker_identity()

    def _pool_agent(self) -> AgentIdentity | None:
        """A user of its own from the node's pool (`agent_pool`), when the node uses the default
        agent user and the worker can switch users; None otherwise or when the pool is busy."""
        settings = _settings()
        if settings.agent_user or not identity.node_identity().switch:
            return None
        return AgentPool(settings.agent_claims_dir).claim(self.path)

    def release_agent(self, agent: AgentIdentity) -> None:
        """Give a pool user back (nothing to do for any other identity)."""
        if agent.name.startswith(POOL_PREFIX):
            AgentPool(_settings().agent_claims_dir).release(self.path, agent.uid)

    def give_dirs(self) -> None:
        """The agent owns its directories; the runtime directory stays the worker's, unlisted."""
        agent = self.agent
        if not agent.switch:
            return
        self.path.chmod(0o711)
        info = self.root.stat()
        if info.st_uid == os.geteuid() and not info.st_mode & stat.S_ISVTX:
            # enterable, not listable: an agent cannot read the other runtimes' ids (a shared
            # sticky directory such as /tmp itself is left alone)
            self.root.chmod(stat.S_IMODE(info.st_mode) & ~0o044)
        for directory in self.agent_dirs:
            os.lchown(directory, agent.uid, agent.gid)
            if self.owner_only_dirs:
                # agents of other runtimes (other pool users) cannot look in
                directory.chmod(0o700)

    def recreate_dirs(self) -> None:
        """Replace the agent directories by empty ones the agent owns (a reset)."""
        for directory in self.agent_dirs:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True, exist_ok=True)
        self.give_dirs()

    def empty_dirs(self) -> None:
        """Empty the agent directories in place (bind mounts hold on to the directories)."""
        for directory in self.agent_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            for entry in directory.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()

    def remove_quietly(self) -> None:
        """Delete the whole runtime directory as far as it goes (see `check_removed`)."""
        self._record = None
        shutil.rmtree(self.path, ignore_errors=True)

    def check_removed(self) -> None:
        if self.path.exists():
            raise RuntimeError(f"runtime {self.runtime_id}: could not remove {self.path}")

    def hand_over(self) -> None:
        identity.chown_tree(self.workdir, self.agent)

    def host_env(self) -> dict[str, str]:
        """The environment a command run by its node paths starts from (`local`, `bwrap`)."""
        env = {key: os.environ[key] for key in PASSTHROUGH_ENV if key in os.environ}
        env.setdefault("PATH", os.defpath)
        return {**env, **self.home_env()}

    def home_env(self) -> dict[str, str]:
        return {"HOME": str(self.path / "home"), "TMPDIR": str(self.path / "tmp")}

    # -- files ---------------------------------------------------------------------------------

    def upload(self, data: bytes, dest: str) -> None:
        """Write a file the agent owns (and the directories made for it), so it can use it; never
        through a link the agent left (see `safe_files`: UnsafePath otherwise)."""
        candidate = Path(dest)
        # lexically (links are refused by `safe_files` below, not followed here)
        target = Path(
            os.path.normpath(candidate if candidate.is_absolute() else self.workdir / dest)
        )
        # only into the agent's own directories: a link the agent planted must not make the
        # worker overwrite the runtime's records (runtime.json names the user commands run as)
        # (resolved only when the lexical paths do not match: a root below a linked directory)
        mine = itertools.chain(self.agent_dirs, (d.resolve() for d in self.agent_dirs))
        if not any(target.is_relative_to(d) and target != d for d in mine):
            where = "runtime" if not target.is_relative_to(self.path) else "workspace, home and tmp"
            raise safe_files.UnsafePath(f"path {dest!r} is outside {where} {self.runtime_id}")
        made = []  # the missing parents up to the first that exists (its own parents exist)
        for parent in target.parents:
            if not parent.is_relative_to(self.path) or parent.exists():
                break
            made.append(parent)
        safe_files.write_file(self.path, dest, self.workdir, data)
        agent = self.agent
        if agent.switch:
            for path in [target, *made]:
                os.lchown(path, agent.uid, agent.gid)

    def download(self, path: str) -> bytes:
        """Never through a link the agent left: see `safe_files` (UnsafePath otherwise)."""
        return safe_files.read_file(self.path, path, self.workdir)

    def refuse_links(self, path: str) -> None:
        safe_files.refuse_links(self.path, path, self.workdir)

    def resolve(self, path: str | None) -> Path:
        """Map a sandbox path (None: the workdir) to the host, refusing anything outside."""
        if not path:
            return self.workdir
        candidate = Path(path)
        full = (candidate if candidate.is_absolute() else self.workdir / candidate).resolve()
        if not full.is_relative_to(self.path.resolve()):
            raise ValueError(f"path {path!r} is outside runtime {self.runtime_id}")
        return full

    def require_started(self) -> None:
        if not self.workdir.is_dir():
            raise RuntimeError(f"runtime {self.runtime_id} is not started (no {self.workdir})")


def _limits_dict(limits: ResourceLimits) -> dict[str, Any]:
    return {
        "memory_mb": limits.memory_mb,
        "cpu_seconds": limits.cpu_seconds,
        "max_open_files": limits.max_open_files,
    }


def _settings() -> Settings:
    from polar_mq.config import get_settings  # config imports nothing of the runtimes

    return get_settings()


def space_of(runtime: Runtime) -> RuntimeDir:
    """The `RuntimeDir` a runtime composes (every kind of this package has one), for the node
    services that work on its directory (the warm pool's baseline)."""
    space = getattr(runtime, "space", None)
    if not isinstance(space, RuntimeDir):
        raise TypeError(f"runtime kind {runtime.kind!r} keeps no directory on this node")
    return space


class DirBacked:
    """The half every runtime kind shares: its `RuntimeDir` and the file methods that only
    delegate to it. Mixed in beside `Runtime` (`class X(DirBacked, Runtime)`), so the kinds stay
    siblings and the delegations are written once."""

    runtime_id: str
    space: RuntimeDir

    def _attach_dir(
        self,
        root: Path,
        kind: str,
        limits: ResourceLimits | None,
        agent: AgentIdentity | None,
        *,
        owner_only_dirs: bool,
        pooled: bool,
        kill_grace_s: float,
        drain_s: float,
    ) -> None:
        self.space = RuntimeDir(
            self.runtime_id,
            root,
            kind,
            limits,
            agent,
            owner_only_dirs=owner_only_dirs,
            pooled=pooled,
        )
        self.root = self.space.root
        self.path = self.space.path
        self.kill_grace_s = kill_grace_s
        self.drain_s = drain_s

    @property
    def workdir(self) -> Path:
        return self.space.workdir

    @property
    def limits(self) -> ResourceLimits | None:
        """Limits given to this handle, else those recorded by whoever started the runtime."""
        return self.space.limits

    @property
    def agent(self) -> AgentIdentity:
        """Who commands run as: recorded at `start()`, so every later handle agrees with it."""
        return self.space.agent

    def hand_over(self) -> None:
        self.space.hand_over()

    def upload(self, data: bytes, dest: str) -> None:
        """Write a file the agent owns, never through a link it left (`RuntimeDir.upload`)."""
        self.space.upload(data, dest)

    def download(self, path: str) -> bytes:
        """Never through a link the agent left: see `safe_files` (UnsafePath otherwise)."""
        return self.space.download(path)

    def refuse_links(self, path: str) -> None:
        self.space.refuse_links(path)
