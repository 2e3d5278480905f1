"""Making sure a rollout's preset is installed on the node that runs it (the prepare stage).

A missing install fails the rollout at prepare with the command that fixes it, instead of an agent
that dies with "command not found" and is scored; with `auto_install` the node installs it once
(under the install lock, so concurrent rollouts wait for one install).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.install import InstallError, find_install, install


class HarnessMissing(RuntimeError):
    """The preset is not installed here and the job did not ask for `auto_install`."""


def ensure_installed(harness_root: Path, harness_spec: Mapping[str, Any], node: str) -> str | None:
    """None for non-preset harnesses; else `name@version` once it is installed on this node."""
    harness = get_harness(harness_spec)
    if not isinstance(harness, PresetHarness):
        return None
    preset, version = harness.preset, harness.version
    label = f"{preset.name}@{version}"
    if find_install(harness_root, preset.name, preset.package, version) is not None:
        return label
    if not harness.auto_install:
        raise HarnessMissing(
            f"harness {label} is not installed on node {node} (under {harness_root}): run "
            f"`polar-mq harness install {label}` there, or set harness.auto_install: true"
        )
    try:
        install(harness_root, preset.name, preset.package, version)
    except InstallError as exc:
        raise HarnessMissing(f"installing harness {label} on node {node} failed: {exc}") from exc
    return label
