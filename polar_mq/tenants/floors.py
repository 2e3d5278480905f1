"""Isolation floors: the weakest isolation and the largest resources a tenant's job may ask for.

A tenant picks its job's runtime, so without a floor a `jobs:write` key could choose `local` (no
network policy at all) or a sandbox on the node's network, reach PostgreSQL and Redis from its
agent, and write itself an admin key. The operator sets the floor (`Settings.tenant_*`):

- which runtime kinds and network policies tenants may use (`POLAR_MQ_TENANT_RUNTIMES`,
  `POLAR_MQ_TENANT_NETWORKS`); a job that leaves its network unset gets the first allowed one,
  a job that names one outside the list is refused;
- a cap on every resource limit (memory, processes, CPU seconds, open files, file size, the
  agent's wall clock), checked for tenants only;
- defaults for the limits a job leaves unset (`POLAR_MQ_RUNTIME_DEFAULT_*`), written into every
  job's stored spec, admins' included, so the workers enforce what was stored.

Keys with the `admin` scope are the operator's own and are not bound by the kinds, networks and
caps (they may still run `local` for their own trusted code). Each setting left unset takes its
environment's default: production is strict (`PRODUCTION_FLOOR`), development and the embedded
mode are permissive (`DEVELOPMENT_FLOOR`, what the demo and the README's examples submit). `0`
means no cap (or no default) for a numeric setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

from polar_mq.config import Settings
from polar_mq.infra.errors import PolarError
from polar_mq.spec.model import RuntimeSpec, TimeoutSpec

ISOLATION_FLOOR = "isolation_floor"
"""The API error type of a refused submission (422)."""
PIDS_KINDS = ("bwrap", "docker")
"""The kinds that can enforce a process limit (`runtimes.options.KIND_OPTIONS`)."""
LOCAL_NETWORK = "host"
"""`local` has no network policy: its agent is on the node's network."""


@dataclass(frozen=True, slots=True)
class Limits:
    """One value per limit of a job's runtime (and its agent's wall clock); None: none."""

    memory_mb: int | None = None
    pids: int | None = None
    cpu_seconds: int | None = None
    max_open_files: int | None = None
    file_size_mb: int | None = None
    agent_s: float | None = None


PRODUCTION_RUNTIMES = ("bwrap", "docker")
PRODUCTION_NETWORKS = ("proxy_only",)
PRODUCTION_CAPS = Limits(
    memory_mb=32_768,
    pids=4_096,
    cpu_seconds=14_400,
    max_open_files=65_536,
    file_size_mb=10_240,
    agent_s=None,  # production: Settings.max_agent_timeout_s (see `floor_of`)
)
PRODUCTION_DEFAULTS = Limits(
    memory_mb=4_096, pids=512, cpu_seconds=3_600, max_open_files=4_096, file_size_mb=2_048
)
"""What a production job that sets no limit gets (docs/hardening.md). `memory_mb` is the address
space (RLIMIT_AS) under local and bwrap, the container's memory under docker."""


@dataclass(frozen=True, slots=True)
class IsolationFloor:
    """What one submitter may ask for; `runtimes`/`networks` None: any kind / any network."""

    runtimes: tuple[str, ...] | None = None
    networks: tuple[str, ...] | None = None
    caps: Limits = field(default_factory=Limits)
    defaults: Limits = field(default_factory=Limits)
    bound: bool = False
    """False for the operator (admin keys, in-cluster admin code): only the defaults apply."""


OPEN_FLOOR = IsolationFloor()
"""No floor at all: what a job written without Settings (tests, old callers) gets."""


class FloorViolation(PolarError):
    """A job below its submitter's isolation floor; `setting` names what the operator would change
    to allow it (the API answers 422, type `isolation_floor`)."""

    status = 422
    type = ISOLATION_FLOOR

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message, details=[{"setting": setting, "message": message}])
        self.setting = setting


def _setting(value: int | float | None, production: int | float | None) -> int | float | None:
    """A numeric floor setting: unset takes the environment's value, 0 means none."""
    if value is None:
        return production
    return None if value == 0 else value


def floor_of(settings: Settings, *, bound: bool) -> IsolationFloor:
    """The floor `settings` put on a submitter (`bound`: a tenant, not the operator)."""
    prod = settings.is_production
    caps_base = PRODUCTION_CAPS if prod else Limits()
    defaults_base = PRODUCTION_DEFAULTS if prod else Limits()
    agent_cap = settings.max_agent_timeout_s if prod else None
    caps = Limits(
        memory_mb=_int(settings.tenant_max_memory_mb, caps_base.memory_mb),
        pids=_int(settings.tenant_max_pids, caps_base.pids),
        cpu_seconds=_int(settings.tenant_max_cpu_seconds, caps_base.cpu_seconds),
        max_open_files=_int(settings.tenant_max_open_files, caps_base.max_open_files),
        file_size_mb=_int(settings.tenant_max_file_size_mb, caps_base.file_size_mb),
        agent_s=_setting(settings.tenant_max_agent_s, agent_cap),
    )
    defaults = Limits(
        memory_mb=_int(settings.runtime_default_memory_mb, defaults_base.memory_mb),
        pids=_int(settings.runtime_default_pids, defaults_base.pids),
        cpu_seconds=_int(settings.runtime_default_cpu_seconds, defaults_base.cpu_seconds),
        max_open_files=_int(settings.runtime_default_open_files, defaults_base.max_open_files),
        file_size_mb=_int(settings.runtime_default_file_size_mb, defaults_base.file_size_mb),
    )
    runtimes, networks = settings.tenant_runtimes, settings.tenant_networks
    if runtimes is None:
        runtimes = list(PRODUCTION_RUNTIMES) if prod else None
    if networks is None:
        networks = list(PRODUCTION_NETWORKS) if prod else None
    return IsolationFloor(
        runtimes=None if runtimes is None else tuple(runtimes),
        networks=None if networks is None else tuple(networks),
        caps=caps,
        defaults=defaults,
        bound=bound,
    )


def _int(value: int | None, production: int | None) -> int | None:
    resolved = _setting(value, production)
    return None if resolved is None else int(resolved)


CAP_SETTINGS = {
    "memory_mb": "POLAR_MQ_TENANT_MAX_MEMORY_MB",
    "pids": "POLAR_MQ_TENANT_MAX_PIDS",
    "cpu_seconds": "POLAR_MQ_TENANT_MAX_CPU_SECONDS",
    "max_open_files": "POLAR_MQ_TENANT_MAX_OPEN_FILES",
    "file_size_mb": "POLAR_MQ_TENANT_MAX_FILE_SIZE_MB",
}


def check_runtime(
    floor: IsolationFloor, runtime: RuntimeSpec, timeouts: TimeoutSpec, *, network: str,
    network_chosen: bool,
) -> RuntimeSpec:  # fmt: skip
    """`runtime` with the floor's defaults and network applied, or FloorViolation.

    `network`: the policy the job would get as submitted (`JobCreate.job_spec`, which resolves an
    unset one); `network_chosen`: whether the job named it; `timeouts`: checked against the wall
    clock cap. Deterministic, so an idempotent resubmission compares equal to the stored job.
    """
    update: dict[str, Any] = _defaults_for(floor.defaults, runtime)
    if floor.bound:
        update.update(_bound_network(floor, runtime.kind, network, network_chosen))
        _check_caps(floor.caps, runtime.model_copy(update=update), timeouts)
    return runtime.model_copy(update=update) if update else runtime


def _defaults_for(defaults: Limits, runtime: RuntimeSpec) -> dict[str, Any]:
    update: dict[str, Any] = {}
    for name in CAP_SETTINGS:
        value = getattr(defaults, name)
        if value is None or getattr(runtime, name) is not None:
            continue
        if name == "pids" and runtime.kind not in PIDS_KINDS:
            continue  # local cannot count processes: refused there (runtimes/options.py)
        update[name] = value
    return update


def _bound_network(
    floor: IsolationFloor, kind: str, network: str, network_chosen: bool
) -> dict[str, Any]:
    """The network update of a tenant's runtime (none when kept), or FloorViolation."""
    if floor.runtimes is not None and kind not in floor.runtimes:
        raise FloorViolation(
            "POLAR_MQ_TENANT_RUNTIMES",
            f"runtime.kind {kind!r} is not allowed for tenants "
            f"(POLAR_MQ_TENANT_RUNTIMES={','.join(floor.runtimes)})",
        )
    allowed = floor.networks
    if allowed is None:
        return {}
    if kind == "local":
        if LOCAL_NETWORK in allowed:
            return {}
        raise FloorViolation(
            "POLAR_MQ_TENANT_NETWORKS",
            "runtime.kind 'local' has no network policy (its agent is on the node's network, "
            f"'host'), which is not allowed for tenants (POLAR_MQ_TENANT_NETWORKS="
            f"{','.join(allowed)})",
        )
    if network in allowed:
        return {"network": network}
    if network_chosen:
        raise FloorViolation(
            "POLAR_MQ_TENANT_NETWORKS",
            f"runtime.network {network!r} is not allowed for tenants "
            f"(POLAR_MQ_TENANT_NETWORKS={','.join(allowed)})",
        )
    return {"network": allowed[0]}


def _check_caps(caps: Limits, runtime: RuntimeSpec, timeouts: TimeoutSpec) -> None:
    for name, setting in CAP_SETTINGS.items():
        cap, asked = getattr(caps, name), getattr(runtime, name)
        if cap is not None and asked is not None and asked > cap:
            raise FloorViolation(
                setting, f"runtime.{name} = {asked} is over the tenants' cap ({setting}={cap})"
            )
    if caps.agent_s is not None and timeouts.agent_s > caps.agent_s:
        raise FloorViolation(
            "POLAR_MQ_TENANT_MAX_AGENT_S",
            f"timeouts.agent_s = {timeouts.agent_s:g} is over the tenants' cap "
            f"(POLAR_MQ_TENANT_MAX_AGENT_S={caps.agent_s:g})",
        )


class FlooredRequest(Protocol):
    """What the floor reads and rewrites of a submitted job (`jobs.schemas.JobCreate`): the
    tenants package sits below the jobs package, so it names the fields, not the class."""

    @property
    def runtime(self) -> RuntimeSpec: ...
    @property
    def timeouts(self) -> TimeoutSpec: ...
    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


Request = TypeVar("Request", bound=FlooredRequest)


def with_floor(spec: Request, floor: IsolationFloor, network: str) -> Request:
    """`spec` within `floor` (defaults filled, a tenant's network settled), or FloorViolation.

    `network`: the policy `spec` resolves to as submitted (`JobCreate.job_spec().runtime.network`).
    """
    if floor == OPEN_FLOOR:
        return spec
    chosen = "network" in spec.runtime.model_fields_set
    runtime = check_runtime(
        floor, spec.runtime, spec.timeouts, network=network, network_chosen=chosen
    )
    return spec if runtime is spec.runtime else spec.model_copy(update={"runtime": runtime})
