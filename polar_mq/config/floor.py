"""The operator's isolation floor for tenants, as settings (`POLAR_MQ_TENANT_*`,
`POLAR_MQ_RUNTIME_DEFAULT_*`); `Settings` inherits them.

A setting left unset takes its environment's value (strict in production, permissive otherwise),
`0` means no cap or no default; `polar_mq.tenants.floors` resolves and enforces them. Kept apart
from `config.py` so that module stays one screenful of process settings.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode

TENANT_FLOOR_CHOICES = {
    "tenant_runtimes": ("local", "bwrap", "docker"),
    "tenant_networks": ("host", "none", "proxy_only"),
}
"""What `POLAR_MQ_TENANT_RUNTIMES` and `POLAR_MQ_TENANT_NETWORKS` may list (`spec.RuntimeSpec`)."""


class FloorSettings(BaseSettings):
    """What tenants (API keys without the admin scope) may ask of a runtime (docs/hardening.md)."""

    tenant_runtimes: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="runtime kinds a key without the admin scope may use (comma-separated or "
        "JSON list); unset: bwrap,docker in production, every kind otherwise "
        "(tenants/floors.py, docs/hardening.md)",
    )
    tenant_networks: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="network policies a key without the admin scope may use; a job that sets "
        "none gets the first; unset: proxy_only in production, every policy otherwise",
    )
    tenant_max_memory_mb: int | None = Field(
        None, ge=0, description="tenants: largest runtime.memory_mb (unset: 32768 in production "
        "and no cap otherwise; 0: no cap)",
    )  # fmt: skip
    tenant_max_pids: int | None = Field(
        None, ge=0, description="tenants: largest runtime.pids (production 4096; 0: no cap)"
    )
    tenant_max_cpu_seconds: int | None = Field(
        None, ge=0, description="tenants: largest runtime.cpu_seconds (production 14400)"
    )
    tenant_max_open_files: int | None = Field(
        None, ge=0, description="tenants: largest runtime.max_open_files (production 65536)"
    )
    tenant_max_file_size_mb: int | None = Field(
        None, ge=0, description="tenants: largest runtime.file_size_mb (production 10240)"
    )
    tenant_max_agent_s: float | None = Field(
        None, ge=0, description="tenants: largest timeouts.agent_s (production: "
        "max_agent_timeout_s)",
    )  # fmt: skip
    runtime_default_memory_mb: int | None = Field(
        None, ge=0, description="every job without runtime.memory_mb gets it (production 4096; "
        "0: none)",
    )  # fmt: skip
    runtime_default_pids: int | None = Field(
        None, ge=0, description="bwrap/docker jobs without runtime.pids (production 512)"
    )
    runtime_default_cpu_seconds: int | None = Field(
        None, ge=0, description="jobs without runtime.cpu_seconds (production 3600)"
    )
    runtime_default_open_files: int | None = Field(
        None, ge=0, description="jobs without runtime.max_open_files (production 4096)"
    )
    runtime_default_file_size_mb: int | None = Field(
        None, ge=0, description="jobs without runtime.file_size_mb (production 2048)"
    )

    @field_validator("tenant_runtimes", "tenant_networks", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """A JSON list or comma-separated, like the other list settings."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return orjson.loads(text)
            return [item.strip() for item in text.split(",") if item.strip()]
        return value

    @field_validator("tenant_runtimes", "tenant_networks")
    @classmethod
    def _known_floor(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """A kind or policy spelt wrong would refuse every tenant's job with a puzzling message."""
        if value is None:
            return None
        known = TENANT_FLOOR_CHOICES[info.field_name or ""]
        unknown = [item for item in value if item not in known]
        if unknown or not value:
            setting = f"POLAR_MQ_{(info.field_name or '').upper()}"
            raise ValueError(
                f"{setting}: {unknown[0]!r} is not one of {', '.join(known)}"
                if unknown
                else f"{setting}: list at least one of {', '.join(known)}"
            )
        return value
