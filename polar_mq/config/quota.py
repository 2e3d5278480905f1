"""A tenant's or key's limits (`QuotaLimits`): the settings hold the defaults, keys and tenants
override them field by field (`polar_mq.tenants.quotas`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class QuotaLimits(BaseModel):
    """One set of limits; a field left `None` inherits from the level above (or is unlimited)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_rollouts_per_request: int | None = Field(None, ge=1, strict=True)
    max_rollouts_in_flight: int | None = Field(None, ge=1, strict=True)
    max_tokens_per_rollout: int | None = Field(None, ge=1, strict=True)

    def overridden_by(self, other: QuotaLimits | None) -> QuotaLimits:
        """These limits with every limit that `other` sets taking precedence."""
        if other is None:
            return self
        return self.model_copy(update=other.model_dump(exclude_none=True))


UNLIMITED = QuotaLimits()
