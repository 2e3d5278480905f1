"""What the two sandboxing kinds, `bwrap` and `docker`, check and set up alike when a handle is
made: they mount the runtime's directories into the sandbox themselves (so the directory is
attached without the `local` kind's reachability check, at its absolute path, which is also the
path inside the sandbox), and both enforce a network policy and a process limit of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from polar_mq.runtimes.base import ResourceLimits
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.workspace_dir import DirBacked

Network = Literal["host", "none", "proxy_only"]
NETWORKS: tuple[Network, ...] = ("host", "none", "proxy_only")


class Sandboxed(DirBacked):
    """`DirBacked` for a kind whose sandbox binds the runtime's directories itself and enforces
    `network` and `pids_limit`. Mixed in beside `Runtime` as `DirBacked` is
    (`class X(Sandboxed, Runtime)`)."""

    kind: ClassVar[str]
    owner_only_dirs: ClassVar[bool]
    network: Network
    pids_limit: int | None

    def _set_up_sandbox(
        self,
        root: Path,
        limits: ResourceLimits | None,
        agent: AgentIdentity | None,
        *,
        network: str,
        pids_limit: int | None,
        kill_grace_s: float,
        drain_s: float,
    ) -> None:
        """Attach the directory under `root`, made absolute (the sandbox binds it at the same
        path inside), and take the network policy and process limit once they are valid."""
        self.network = checked_network(self.kind, network)
        self.pids_limit = checked_pids_limit(pids_limit)
        self._attach_dir(
            Path(root).resolve(),
            self.kind,
            limits,
            agent,
            owner_only_dirs=self.owner_only_dirs,
            pooled=False,  # no reachability check: the sandbox mounts the directories itself
            kill_grace_s=kill_grace_s,
            drain_s=drain_s,
        )


def checked_network(kind: str, network: str) -> Network:
    """`network` if the sandbox can enforce it, else a ValueError naming the choices."""
    if network not in NETWORKS:
        raise ValueError(f"{kind} network must be one of {', '.join(NETWORKS)}, not {network!r}")
    return network


def checked_pids_limit(pids_limit: int | None) -> int | None:
    """`pids_limit` if it is a positive int or None, else a ValueError."""
    if pids_limit is not None and (not isinstance(pids_limit, int) or pids_limit < 1):
        raise ValueError("pids_limit must be a positive int or None")
    return pids_limit
