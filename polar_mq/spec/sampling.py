"""A job's `sampling` as the stages read it: `SamplingSpec`, the submitted mapping kept as sent.

The door checks it (`capability.sampling.validate_sampling`: known keys, usable enforced values)
and stores it as it came, key order and explicit nulls included: the API shows it back that way
and an idempotent resubmission compares equal to it. So the model keeps the mapping (`root`,
serialized unchanged) and types only the reads: a value the platform uses is a number or absent,
never a string that an `enforce: off` job was allowed to keep. The proxy's policy is built from
the whole mapping (`capability.sampling.sampling_policy(spec.sampling.root)`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ConfigDict, Field, RootModel


def _number(value: Any) -> int | float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SamplingSpec(RootModel[dict[str, Any]]):
    """The job's sampling values and `enforce` modes. Frozen; `root` must be treated as
    read-only too (every stage of the job shares the cached spec)."""

    model_config = ConfigDict(frozen=True)
    root: dict[str, Any] = Field(default_factory=dict)

    @property
    def temperature(self) -> int | float | None:
        return _number(self.root.get("temperature"))

    @property
    def top_p(self) -> int | float | None:
        return _number(self.root.get("top_p"))

    @property
    def top_k(self) -> int | None:
        return _integer(self.root.get("top_k"))

    @property
    def max_tokens(self) -> int | None:
        """Per call (the rollout's budget is the job's `max_tokens_per_rollout`)."""
        return _integer(self.root.get("max_tokens"))

    @property
    def seed(self) -> int | None:
        """The job's seed, from which each rollout's own is derived (`run_agent.rollout_seed`)."""
        return _integer(self.root.get("seed"))

    @property
    def enforce(self) -> object:
        """How the proxy applies the values: one mode or {field: mode}; None: the defaults
        (`capability.sampling.enforce_modes` reads it)."""
        return self.root.get("enforce")
