"""The job spec as stored: what the submitter asked for plus the defaults resolved at submit.

Resolved once, at submit, and stored, so every stage reads one value and the API shows the job
what it really runs with. Today: the runtime's network, whose default depends on whether the
harness is one we vouch for (runtimes/options.py `effective_network`).
"""

from __future__ import annotations

from typing import Any

from polar_mq.harnesses.presets.registry import get_preset
from polar_mq.jobs.schemas import JobCreate
from polar_mq.runtimes.options import effective_network


def harness_trusted(harness_type: str) -> bool:
    """The `command` harness and the reference agent are the user's or our own code; a preset
    is third-party code and trusted only when it says so."""
    preset = get_preset(harness_type)
    return preset is None or preset.trusted


def stored_job_spec(spec: JobCreate, pool: str) -> dict[str, Any]:
    """`spec.stored_spec()` with its pool and the effective runtime network."""
    stored = {**spec.stored_spec(), "pool": pool}
    runtime = spec.runtime
    chosen = runtime.network if "network" in runtime.model_fields_set else None
    network = effective_network(runtime.kind, chosen, trusted=harness_trusted(spec.harness.type))
    stored["runtime"] = {**stored.get("runtime", {}), "network": network}
    return stored
