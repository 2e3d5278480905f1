"""The `docker` runtime: one long-lived container per runtime; commands run in it by `docker exec`.

The container is the sandbox: an image, memory/cpu/pids limits enforced by its cgroup, a network
of `none` (no interface but loopback), `host` (the node's network, so the proxy on 127.0.0.1 is
reachable) or `proxy_only` (`none` plus the proxy, through a relay: `docker_relay.py`), no new
privileges. Its init (`docker-init`) reaps orphans and `sleep infinity` keeps
it up between stages, so processes an exec leaves in the background live until reset or stop
(both kill every process of the container). `/tmp` and `/var/tmp` are tmpfs mounts made afresh at
each container start, so a runtime reset for the warm pool keeps none of the last agent's files.

Re-attach: the container is named from the runtime id and the runtime root, so any process on the
node finds it by name; labels (`LABEL_RUNTIME`, `LABEL_ROOT`) let the janitor find orphans. Files:
the runtime's workspace, home and tmp directories live on the node (as for `local`) and are bind
mounted at the same paths inside the container, so `workdir`, `upload` and `download` mean the same
on both sides and work even while the container is stopped.

Never root: every exec runs as the node's agent identity (`identity.py`, `docker exec --user
uid:gid`), which owns those directories; the container's keep-alive stays the image's user. The
container's pid namespace hides the node's processes. The network policy is a label of the
container (`LABEL_NETWORK`), so every handle relays the way the container was made.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from contextlib import nullcontext
from functools import lru_cache
from pathlib import Path
from typing import Any

from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import Ulimit

import docker
from polar_mq.runtimes import docker_relay
from polar_mq.runtimes.base import ExecRequest, ExecResult, ResourceLimits, Runtime
from polar_mq.runtimes.docker_exec import container_pids, run_exec
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.process_kit import EXEC_TAG, RUNTIME_TAG
from polar_mq.runtimes.proxy_relay import ProxyRelay, record_route, recorded_route
from polar_mq.runtimes.sandboxed import Network, Sandboxed

LABEL_RUNTIME = "org.polar-mq.runtime-id"
LABEL_ROOT = "org.polar-mq.runtime-root"
LABEL_NETWORK = "org.polar-mq.network"
KEEPALIVE = ["sleep", "infinity"]
PRIVATE_TMP = ("/tmp", "/var/tmp")
"""Temporary directories on a tmpfs of the container's own (its /dev/shm already is one)."""
PRIVATE_TMP_OPTIONS = "rw,exec,nosuid,nodev,mode=1777"


@lru_cache(maxsize=1)
def default_client() -> docker.DockerClient:
    """One client per process, built on first use from DOCKER_HOST & co (not at import).

    Each running exec holds one connection for its output stream, so the pool is sized for many
    concurrent agents, not the SDK's default of 10.
    """
    return docker.from_env(max_pool_size=256)


def docker_available(client: docker.DockerClient | None = None) -> str | None:
    """None when a Docker engine answers, else why not (for skips and clear start errors)."""
    try:
        (client or default_client()).ping()
    except DockerException as exc:
        return f"no Docker engine reachable ({exc}); start one with scripts/docker_engine.sh"
    return None


def container_name(runtime_id: str, root: Path) -> str:
    """Unique per (root, id) on an engine: two runtime roots may reuse an id (tests do)."""
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:10]
    return f"polar-mq-{runtime_id}-{digest}"


class DockerRuntime(Sandboxed, Runtime):
    """A runtime made of a container and the node-side directories bind mounted into it.

    `python` names the image's interpreter for the reference agent (`python3` on the image's PATH).
    `image`, `network`, `cpus` and `pids_limit` (and `limits`: memory as the container's memory
    limit without swap, cpu seconds and open files as ulimits) are used when `start()` creates the
    container; later handles need only the id and root.
    """

    kind = "docker"
    owner_only_dirs = True

    def __init__(
        self,
        runtime_id: str,
        root: Path,
        limits: ResourceLimits | None = None,
        *,
        image: str | None = None,
        network: Network = "host",
        cpus: float | None = None,
        pids_limit: int | None = None,
        python: str = "python3",
        client: docker.DockerClient | None = None,
        kill_grace_s: float = 2.0,
        drain_s: float = 0.5,
        agent: AgentIdentity | None = None,
    ) -> None:
        super().__init__(runtime_id)
        self._set_up_sandbox(
            root, limits, agent, network=network, pids_limit=pids_limit,
            kill_grace_s=kill_grace_s, drain_s=drain_s,
        )  # fmt: skip
        if cpus is not None and not cpus > 0:
            raise ValueError("cpus must be positive or None")
        self.image = image
        self.cpus = cpus
        self._python = python
        self._client = client
        self.name = container_name(self.runtime_id, self.root)

    @property
    def python(self) -> str:
        """The image's interpreter (found on the image's PATH unless a path is given)."""
        return self._python

    @property
    def client(self) -> docker.DockerClient:
        return self._client or default_client()

    def container(self) -> Container | None:
        """The runtime's container, or None when there is none (never started, or stopped)."""
        try:
            return self.client.containers.get(self.name)
        except NotFound:
            return None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self.space.create()
        if self.network == "proxy_only":
            docker_relay.prepare(self.path)
        found = self.container()
        created = found is None
        if found is None:
            found = self._create()
        if found.status != "running":
            found.start()
            self._wait_keepalive()
        if created and self.network == "proxy_only":
            self._check_forwarder()

    def _wait_keepalive(self, timeout_s: float = 30.0) -> None:
        """Return once the init has forked the keep-alive: the engine's start returns before,
        and a leak check taken then counted the keep-alive as a leak (seen in CI under load)."""
        end = time.monotonic() + timeout_s
        while len(container_pids(self.client.api, self.name)) < 2:  # docker-init + keep-alive
            if time.monotonic() >= end:
                raise RuntimeError(
                    f"runtime {self.runtime_id}: the container's keep-alive never ran"
                )
            time.sleep(0.02)

    def _check_forwarder(self) -> None:
        """Fail at start (the prepare stage), not as the agent's error, without an interpreter."""
        probe = self.exec(docker_relay.check_argv(self.python), timeout=60)
        if not probe.ok:
            detail = (probe.stderr_tail or probe.stdout_tail).strip()[-300:]
            raise RuntimeError(
                f"network proxy_only: image {self.image!r} cannot run the proxy forwarder with "
                f"{self.python!r} (set runtime.python to the image's Python 3): {detail}"
            )

    def _create(self) -> Container:
        if not self.image:
            raise ValueError("the docker runtime needs an image (runtime.image in the job spec)")
        try:
            return self.client.containers.create(**self._create_args())
        except ImageNotFound as exc:
            raise RuntimeError(
                f"docker image {self.image!r} is not on this node; build or load it first "
                "(e.g. scripts/build_test_image.sh); no registry is pulled from"
            ) from exc
        except APIError as exc:
            if exc.status_code == 409:  # another process created it first
                existing = self.container()
                if existing is not None:
                    return existing
            raise

    def _create_args(self) -> dict[str, Any]:
        binds = self.space.agent_dirs
        args: dict[str, Any] = {
            "image": self.image,
            "command": KEEPALIVE,
            "name": self.name,
            "labels": {
                LABEL_RUNTIME: self.runtime_id,
                LABEL_ROOT: str(self.root),
                LABEL_NETWORK: self.network,
            },
            "init": True,
            "detach": True,
            "hostname": "sandbox",
            "network_mode": "none" if self.network == "proxy_only" else self.network,
            "working_dir": str(self.workdir),
            "volumes": {str(d): {"bind": str(d), "mode": "rw"} for d in binds},
            # mounted afresh at every (re)start: a reset runtime keeps nothing of the last
            # rollout's temporary files (the engine puts the binds below /tmp on top)
            "tmpfs": {path: PRIVATE_TMP_OPTIONS for path in PRIVATE_TMP},
            "security_opt": ["no-new-privileges"],
        }
        if self.network == "proxy_only":
            args["volumes"].update(docker_relay.mount(self.path))
        limits = self.limits
        if limits is not None and limits.memory_mb is not None:
            args["mem_limit"] = f"{limits.memory_mb}m"
            args["memswap_limit"] = f"{limits.memory_mb}m"  # no swap on top
        ulimits = []
        if limits is not None and limits.cpu_seconds is not None:
            ulimits.append(Ulimit(name="cpu", soft=limits.cpu_seconds, hard=limits.cpu_seconds + 1))
        if limits is not None and limits.max_open_files is not None:
            n = limits.max_open_files
            ulimits.append(Ulimit(name="nofile", soft=n, hard=n))
        if limits is not None and limits.file_size_mb is not None:
            size = limits.file_size_mb * 1024 * 1024
            ulimits.append(Ulimit(name="fsize", soft=size, hard=size))
        if ulimits:
            args["ulimits"] = ulimits
        if self.cpus is not None:
            args["nano_cpus"] = int(self.cpus * 1e9)
        if self.pids_limit is not None:
            args["pids_limit"] = self.pids_limit
        return args

    def reset(self) -> None:
        """Restart the container (every process dies, limits stay) and empty its directories.

        The directories are emptied, not recreated: the container's bind mounts hold on to them.
        """
        found = self.container()
        if found is not None and found.status == "running":
            found.kill()
        self.space.empty_dirs()
        if found is not None:
            found.start()
            self._wait_keepalive()

    def stop(self) -> None:
        """Remove the container, then the node-side directories; idempotent, from any process.

        Unlike `local`, no tag scan: the container's removal kills all of its processes, and a
        scan by runtime id could hit a same-named runtime of another root.
        """
        self.remove_container()
        self.space.remove_quietly()
        self.space.check_removed()

    def remove_container(self, timeout: float = 30.0) -> None:
        """Force-remove the container and wait until the engine no longer knows it."""
        end = time.monotonic() + timeout
        while True:
            try:
                self.client.api.remove_container(self.name, force=True)
            except NotFound:
                return
            except APIError as exc:
                if exc.status_code != 409 or time.monotonic() >= end:  # 409: removal under way
                    raise
            if self.container() is None:
                return
            time.sleep(0.05)

    def alive_processes(self) -> list[int]:
        return sorted(container_pids(self.client.api, self.name))

    # -- proxy route (network: proxy_only) ------------------------------------------------------

    def _network(self, found: Container | None) -> str:
        """The policy the container was made with (its label), else this handle's."""
        labels = found.labels if found is not None else {}
        return str(labels.get(LABEL_NETWORK) or self.network)

    def agent_proxy_url(self, url: str) -> str:
        if self._network(self.container()) != "proxy_only":
            return url
        return record_route(self.path, url)

    # -- processes -----------------------------------------------------------------------------

    def _run(self, request: ExecRequest) -> ExecResult:
        found = self.container()
        if found is None or found.status != "running" or not self.workdir.is_dir():
            raise RuntimeError(f"runtime {self.runtime_id} is not started (no running container)")
        argv = request.argv
        exec_id = uuid.uuid4().hex
        # HOME and TMPDIR only: PATH and locale come from the image, nothing from the worker
        full_env = {**self.space.home_env(), **request.env, RUNTIME_TAG: self.runtime_id}
        full_env[EXEC_TAG] = exec_id
        route = recorded_route(self.path) if self._network(found) == "proxy_only" else None
        relay_dir = docker_relay.relay_dir(self.path)
        with ProxyRelay(route, self.agent, relay_dir) if route else nullcontext() as relay:
            if relay is not None:
                argv = docker_relay.wrap(self.python, relay.socket_name, argv)
            return run_exec(
                self.client.api,
                str(found.id),
                argv,
                request,
                environment=full_env,
                workdir=str(self.space.resolve(request.cwd)),
                user=f"{self.agent.uid}:{self.agent.gid}",  # never the image's root
                tag=f"{EXEC_TAG}={exec_id}",
                drain_s=self.drain_s,
                kill_grace_s=self.kill_grace_s,
            )
